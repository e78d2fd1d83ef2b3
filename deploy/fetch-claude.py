"""Fetch Claude Code's native binary from its npm platform package, for deploy/Dockerfile.

Usage: python3 fetch-claude.py VERSION INTEGRITY OUT

Downloads ``@anthropic-ai/claude-code-linux-x64@VERSION`` from the npm registry (``NPM_REGISTRY``,
default https://registry.npmjs.org), checks it against INTEGRITY (the ``sha512-...`` that npm
records in its lock file for that version), and writes the package's ``claude`` binary to OUT.
Only the standard library: the build stage has Debian's Python and no Node.js. A mismatch exits
non-zero naming both digests, so a tampered or changed package never reaches the image.
"""

import base64
import hashlib
import io
import os
import sys
import tarfile
import urllib.request

PACKAGE = "@anthropic-ai/claude-code-linux-x64"
MAX_BYTES = 1 << 30  # the 2.1 binary is about 373 MB; anything past 1 GiB is not that package


def main(version: str, integrity: str, out: str) -> None:
    registry = os.environ.get("NPM_REGISTRY", "https://registry.npmjs.org").rstrip("/")
    name = PACKAGE.rsplit("/", 1)[1]
    url = f"{registry}/{PACKAGE}/-/{name}-{version}.tgz"
    with urllib.request.urlopen(url, timeout=300) as resp:
        data = resp.read(MAX_BYTES + 1)
    if len(data) > MAX_BYTES:
        sys.exit(f"{url}: larger than {MAX_BYTES} bytes")
    algo, _, want = integrity.partition("-")
    got = base64.b64encode(hashlib.new(algo, data).digest()).decode()
    if got != want:
        sys.exit(f"{url}: integrity {algo}-{got}, expected {integrity}")
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        member = tar.extractfile("package/claude")
        if member is None:
            sys.exit(f"{url}: no package/claude in the tarball")
        with open(out, "wb") as f:
            f.write(member.read())
    os.chmod(out, 0o755)


if __name__ == "__main__":
    if len(sys.argv) != 4:
        sys.exit(__doc__)
    main(*sys.argv[1:])
