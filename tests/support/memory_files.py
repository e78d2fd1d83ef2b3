"""A workspace in memory for what a parser reads from the workspace (file changes, diffs)."""

from __future__ import annotations


class Files:
    """Paths to texts; ``root`` goes before each name given. A path it does not hold is not
    found, as on disk; tests change ``files`` between a parser's reads."""

    def __init__(self, root: str = "", /, **files: str) -> None:
        self.files = {f"{root}{k}": v for k, v in files.items()}

    def read(self, path: str) -> str | None:
        if path not in self.files:
            raise FileNotFoundError(path)
        return self.files[path]
