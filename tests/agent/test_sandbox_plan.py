"""The sandbox's decisions, pure (gateway/agent/sandbox/plan.py): settings, a workspace, a HOME and
the paths to hide in, the bubblewrap argv out. Nothing here runs bwrap: tests/agent/test_sandbox.py
does, with a hostile agent."""

from __future__ import annotations

from dataclasses import replace

import pytest

from gateway.agent.exit import AgentStartError
from gateway.agent.sandbox import system
from gateway.agent.sandbox.plan import (
    DEFAULT_PATH,
    MASK_TMPFS_BYTES,
    Isolation,
    Layout,
    Mask,
    bwrap_argv,
    check_path,
    check_system_root,
    group_with,
    limit_named,
    module_run,
    passwd_with,
    sandbox_environment,
)

SANDBOX = Isolation(mode="sandbox")
EMPTY = "/tmp/rawp-gateway-homes-x/empty"  # the shell's empty read-only file
SYSTEM = (("/usr", None), ("/bin", "usr/bin"), ("/lib", "usr/lib"), ("/etc", None), ("/opt", None))


def layout(
    *masks: Mask,
    workspace: str = "/srv/work/alice",
    home: str = "/var/lib/rawp/sessions/s1/home",
    **kw,
) -> Layout:
    fields = {"system": SYSTEM, "prlimit": "/usr/bin/prlimit", **kw}
    return Layout(
        bwrap="/usr/bin/bwrap",
        workspace=workspace,
        home=home,
        empty=EMPTY,
        masks=masks,
        **fields,
    )


def mounts(argv: list[str]) -> list[tuple[str, ...]]:
    """The mount options of an argv, each with its arguments, in order."""
    arity = {"--ro-bind": 2, "--bind": 2, "--symlink": 2, "--tmpfs": 1, "--proc": 1, "--dev": 1}
    out, i = [], 0
    end = argv.index("--chdir")
    while i < end:
        if argv[i] in arity:
            n = arity[argv[i]]
            out.append(tuple(argv[i : i + n + 1]))
            i += n + 1
        else:
            i += 1
    return out


def test_namespaces_and_the_command_under_prlimit():
    argv = bwrap_argv(SANDBOX, layout(), ["claude", "-p", "--", "hi"], "/srv/work/alice")
    assert argv[0] == "/usr/bin/bwrap"
    for flag in (
        "--unshare-user",
        "--unshare-pid",
        "--unshare-ipc",
        "--unshare-uts",
        "--die-with-parent",
        "--new-session",
    ):
        assert flag in argv
    assert "--unshare-net" not in argv  # network = "host"
    tail = argv[argv.index("--chdir") :]
    assert tail == [
        "--chdir",
        "/srv/work/alice",
        "--",
        "/usr/bin/prlimit",
        "--nproc=512",
        f"--data={4096 << 20}",
        "--",
        "claude",
        "-p",
        "--",
        "hi",
    ]
    assert "--unsetenv" not in argv and "--setenv" not in argv  # the environment is made before
    none = bwrap_argv(Isolation(mode="sandbox", network="none"), layout(), ["a"], "/")
    assert "--unshare-net" in none


def test_system_read_only_links_kept_fresh_proc_private_tmp_and_the_session_read_write():
    found = mounts(bwrap_argv(SANDBOX, layout(), ["a"], "/srv/work/alice"))
    assert ("--ro-bind", "/usr", "/usr") in found
    assert ("--ro-bind", "/etc", "/etc") in found
    assert ("--symlink", "usr/bin", "/bin") in found
    assert ("--proc", "/proc") in found
    assert ("--dev", "/dev") in found
    assert ("--tmpfs", "/tmp") in found
    assert ("--bind", "/srv/work/alice", "/srv/work/alice") in found
    home = "/var/lib/rawp/sessions/s1/home"
    assert ("--bind", home, home) in found
    # Nothing else of the machine: not / nor /home, /var, /run, /sys.
    shown = {m[-1] for m in found}
    assert not shown & {"/", "/home", "/var", "/run", "/sys", "/srv"}


def test_tmp_is_bounded_by_the_memory_limit():
    argv = bwrap_argv(Isolation(mode="sandbox", max_memory_mb=512), layout(), ["a"], "/")
    i = argv.index("/tmp") - 1
    assert argv[i - 2 : i + 2] == ["--size", str(512 << 20), "--tmpfs", "/tmp"]


def test_binds_of_the_settings():
    settings = Isolation(mode="sandbox", bind_ro=("/opt/tools",), bind_rw=("/data/cache",))
    found = mounts(bwrap_argv(settings, layout(), ["a"], "/"))
    assert ("--ro-bind", "/opt/tools", "/opt/tools") in found
    assert ("--bind", "/data/cache", "/data/cache") in found
    # /opt/tools comes after /opt: a deeper mount is made after the one above it.
    assert found.index(("--ro-bind", "/opt", "/opt")) < found.index(
        ("--ro-bind", "/opt/tools", "/opt/tools")
    )


def test_a_secret_under_a_read_only_system_directory_is_masked():
    """The image's /etc/rawp-gateway/config.toml shows under a read-only /etc unless masked."""
    masks = (
        Mask("/etc/rawp-gateway/config.toml", is_dir=False),
        Mask("/etc/rawp-gateway/users.toml", is_dir=False),
    )
    found = mounts(bwrap_argv(SANDBOX, layout(*masks), ["a"], "/"))
    for mask in masks:
        assert ("--ro-bind", EMPTY, mask.path) in found
        assert found.index(("--ro-bind", "/etc", "/etc")) < found.index(
            ("--ro-bind", EMPTY, mask.path)
        )


def test_what_no_bind_shows_is_left_alone():
    """A token file in /run/secrets or a state dir in /var/lib is not in the sandbox at all: no
    mount is made for it (nor a directory created on its way)."""
    masks = (Mask("/run/secrets/token", is_dir=False), Mask("/var/lib/rawp", is_dir=True))
    argv = bwrap_argv(SANDBOX, layout(*masks), ["a"], "/")
    assert "/run/secrets/token" not in argv
    assert "/var/lib/rawp" not in argv


def test_a_masked_directory_under_a_bind_and_the_session_shown_again_inside_it():
    """The workspace root and the state dir under /opt (bound read-only): each covered with an
    empty tmpfs, then the session's own workspace and HOME bound again on top, in that order."""
    masks = (Mask("/opt/work", is_dir=True), Mask("/opt/state", is_dir=True))
    found = mounts(
        bwrap_argv(
            SANDBOX,
            layout(*masks, workspace="/opt/work/alice", home="/opt/state/sessions/s1/home"),
            ["a"],
            "/",
        )
    )
    order = [
        ("--ro-bind", "/opt", "/opt"),
        ("--tmpfs", "/opt/work"),
        ("--bind", "/opt/work/alice", "/opt/work/alice"),
    ]
    assert [found.index(m) for m in order] == sorted(found.index(m) for m in order)
    assert found.index(("--tmpfs", "/opt/state")) < found.index(
        ("--bind", "/opt/state/sessions/s1/home", "/opt/state/sessions/s1/home")
    )
    argv = bwrap_argv(SANDBOX, layout(*masks), ["a"], "/")
    i = argv.index("/opt/work")
    assert argv[i - 3 : i + 1] == ["--size", str(MASK_TMPFS_BYTES), "--tmpfs", "/opt/work"]


def test_another_workspace_inside_this_one_and_a_secret_inside_it_are_masked():
    masks = (
        Mask("/srv/work/alice/bob-project", is_dir=True),
        Mask("/srv/work/alice/gateway.toml", is_dir=False),
    )
    found = mounts(bwrap_argv(SANDBOX, layout(*masks), ["a"], "/"))
    ws = found.index(("--bind", "/srv/work/alice", "/srv/work/alice"))
    assert found.index(("--tmpfs", "/srv/work/alice/bob-project")) > ws
    assert found.index(("--ro-bind", EMPTY, "/srv/work/alice/gateway.toml")) > ws


def test_the_workspace_root_that_is_the_session_workspace_is_not_masked_over_it():
    masks = (Mask("/srv/work/alice", is_dir=True),)
    found = mounts(bwrap_argv(SANDBOX, layout(*masks), ["a"], "/"))
    assert ("--tmpfs", "/srv/work/alice") not in found


def test_a_secret_inside_a_masked_directory_needs_no_mount_of_its_own():
    masks = (Mask("/opt/state", is_dir=True), Mask("/opt/state/users.toml", is_dir=False))
    found = mounts(bwrap_argv(SANDBOX, layout(*masks), ["a"], "/"))
    assert ("--tmpfs", "/opt/state") in found
    assert ("--ro-bind", EMPTY, "/opt/state/users.toml") not in found


def test_a_linked_file_outside_the_system_directories_is_bound():
    found = mounts(
        bwrap_argv(SANDBOX, layout(extra_ro=("/run/systemd/resolve/stub-resolv.conf",)), ["a"], "/")
    )
    target = "/run/systemd/resolve/stub-resolv.conf"
    assert ("--ro-bind", target, target) in found


def test_what_runs_on_the_gateways_own_python_is_named():
    python = "/srv/app/.venv/bin/python"
    assert module_run([python, "-m", "gateway.demo_agent", "--x"], python) == "gateway"
    assert module_run([python, "-c", "print(1)", "hi"], python) == ""
    assert module_run([python], python) == ""
    assert module_run(["/usr/bin/python3", "-m", "gateway.demo_agent"], python) is None
    assert module_run(["claude", "-p"], python) is None
    assert module_run([], python) is None


def test_the_gateways_own_python_is_shown_where_nothing_shows_it_yet():
    """The venv, the interpreter's installation under a 0700 HOME (/srv/ops), the directory the
    interpreter really is in (inside that installation: no mount of its own) and an editable
    install's package, read-only; not what a system directory shows already, nor the rest of the
    checkout."""
    runtime = (
        "/srv/app/.venv",
        "/srv/ops/.pyenv/versions/3.11.7",
        "/srv/ops/.pyenv/versions/3.11.7/bin",
        "/srv/app/gateway",
        "/usr/lib/python3.11",
    )
    found = mounts(bwrap_argv(SANDBOX, layout(runtime=runtime), ["a"], "/"))
    binds = [m[1] for m in found if m[0] == "--ro-bind"]
    for path in ("/srv/app/.venv", "/srv/ops/.pyenv/versions/3.11.7", "/srv/app/gateway"):
        assert ("--ro-bind", path, path) in found
    assert "/srv/ops/.pyenv/versions/3.11.7/bin" not in binds
    assert "/usr/lib/python3.11" not in binds
    assert "/srv/app" not in binds and "/srv/ops" not in binds


def test_a_secret_inside_the_gateways_own_python_is_still_masked():
    masks = (Mask("/srv/app/.venv/state", is_dir=True), Mask("/srv/app/config.toml", is_dir=False))
    found = mounts(bwrap_argv(SANDBOX, layout(*masks, runtime=("/srv/app/.venv",)), ["a"], "/"))
    assert found.index(("--ro-bind", "/srv/app/.venv", "/srv/app/.venv")) < found.index(
        ("--tmpfs", "/srv/app/.venv/state")
    )
    assert ("--ro-bind", EMPTY, "/srv/app/config.toml") not in found  # nothing shows it


def test_the_environment_inside():
    lay = layout()
    env = sandbox_environment(
        {
            "PATH": "/usr/bin",
            "HOME": "/home/rawp",
            "TMPDIR": "/var/tmp/gateway",
            "XDG_CONFIG_HOME": "/home/rawp/.config",
            "XDG_CACHE_HOME": "/srv/work/alice/.cache",
            "ANTHROPIC_API_KEY": "k",
        },
        SANDBOX,
        lay,
    )
    assert env == {
        "PATH": "/usr/bin",
        "HOME": lay.home,
        "TMPDIR": "/tmp",
        "XDG_CACHE_HOME": "/srv/work/alice/.cache",
        "ANTHROPIC_API_KEY": "k",
    }
    assert sandbox_environment({"TMPDIR": "/tmp/x"}, SANDBOX, lay)["TMPDIR"] == "/tmp/x"


def test_the_limit_an_agent_ran_into_is_named():
    assert limit_named(SANDBOX, "bash: fork: retry: Resource temporarily unavailable") == (
        "the sandbox's max_processes (512) was likely reached ([isolation] max_processes)"
    )
    assert "max_memory_mb (4096)" in (limit_named(SANDBOX, "Traceback...\nMemoryError\n") or "")
    assert limit_named(SANDBOX, "Error: invalid API key") is None
    assert limit_named(Isolation(), "MemoryError") is None  # not sandboxed: no such limit


def test_paths_in_the_profiles_own_home_move_to_the_sessions():
    """A profile whose env sets HOME (its settings, a CLI's own config dir below it): the
    session's HOME started as a copy of it, and what named a path in it names that path in the
    session's HOME."""
    lay = layout()
    home = "/etc/agent-home"
    given = {"HOME": home, "CODEX_HOME": f"{home}/.codex", "TMPDIR": f"{home}/tmp"}
    env = sandbox_environment(
        {**given, "OTHER": "/etc/agent-homely"}, SANDBOX, lay, template=f"{home}/"
    )
    assert env == {
        "HOME": lay.home,
        "CODEX_HOME": f"{lay.home}/.codex",
        "TMPDIR": f"{lay.home}/tmp",
        "OTHER": "/etc/agent-homely",
    }


def test_a_file_the_command_is_given_is_shown_read_only_over_the_hidden_state_dir():
    """An uploaded image named in a single-turn agent's argv (``--image PATH``) lives in the
    session's file store, inside the state dir the sandbox hides: that one file is bound read-only
    at its own path, after the mask, and nothing else of the store shows."""
    image = "/opt/state/sessions/s1/files/t1/screenshot.png"
    masks = (Mask("/opt/state", is_dir=True),)
    found = mounts(bwrap_argv(SANDBOX, layout(*masks, given=(image,)), ["codex"], "/"))
    assert found.index(("--tmpfs", "/opt/state")) < found.index(("--ro-bind", image, image))
    shown = [m for m in found if m[0] in ("--bind", "--ro-bind") and m[-1].startswith("/opt/state")]
    assert shown == [("--ro-bind", image, image)]


# --- a team's system: [isolation] system_root -------------------------------------------------

ROOT = "/toolchain"
TEAM = Isolation(mode="sandbox", system_root=ROOT)
TEAM_SYSTEM = (("/usr", None), ("/bin", "usr/bin"), ("/lib64", "usr/lib64"), ("/etc", None))


def team_layout(*masks: Mask, **kw) -> Layout:
    return layout(*masks, system=TEAM_SYSTEM, root=ROOT, prlimit="/usr/bin/prlimit", **kw)


def test_the_system_comes_from_the_teams_directory_its_links_as_it_has_them():
    found = mounts(bwrap_argv(TEAM, team_layout(), ["claude"], "/srv/work/alice"))
    system = [m for m in found if m[-1] in ("/usr", "/bin", "/lib64", "/etc", "/opt", "/lib")]
    assert system == [
        ("--ro-bind", "/toolchain/usr", "/usr"),
        ("--symlink", "usr/bin", "/bin"),
        ("--symlink", "usr/lib64", "/lib64"),
        ("--ro-bind", "/toolchain/etc", "/etc"),
    ]  # nothing of the gateway's own /usr, /lib or /opt
    assert not any(m[1].startswith(("/usr", "/lib", "/etc")) for m in found if len(m) == 3)


def test_no_mask_is_made_in_a_teams_system_it_shows_none_of_the_gateways_files():
    """The gateway's /etc/rawp-gateway/config.toml is not the team's /etc: nothing to cover (a
    mount point there could not even be made in the read-only image), while a mask of a path a
    bind shows is made as before."""
    masks = (Mask("/etc/rawp-gateway/config.toml", False), Mask("/srv/work", True))
    argv = bwrap_argv(TEAM, team_layout(*masks), ["claude"], "/srv/work/alice")
    assert "/etc/rawp-gateway/config.toml" not in argv
    with_bind = replace(TEAM, bind_ro=("/srv",))
    found = mounts(bwrap_argv(with_bind, team_layout(*masks), ["claude"], "/srv/work/alice"))
    assert ("--tmpfs", "/srv/work") in found


def test_a_rebuilt_directory_is_a_tmpfs_of_its_entries_then_read_only():
    """Where the image has no file to mount the gateway's on (no /etc/hosts in it), /etc is an
    empty tmpfs with each of the team's entries bound again (a link as a link), the gateway's
    files over it, and then read-only: before the command, after every mount inside it."""
    lay = team_layout(
        spliced=(("/etc", (("hosts.allow", None), ("os-release", "../usr/lib/os-release"))),),
        over=(("/etc/hosts", "/etc/hosts"), ("/run/resolv.conf", "/etc/resolv.conf")),
    )
    argv = bwrap_argv(TEAM, lay, ["claude"], "/srv/work/alice")
    found = mounts(argv)
    assert ("--ro-bind", "/toolchain/etc", "/etc") not in found  # made entry by entry instead
    etc = found.index(("--tmpfs", "/etc"))
    inside = [
        ("--ro-bind", "/toolchain/etc/hosts.allow", "/etc/hosts.allow"),
        ("--symlink", "../usr/lib/os-release", "/etc/os-release"),
        ("--ro-bind", "/etc/hosts", "/etc/hosts"),
        ("--ro-bind", "/run/resolv.conf", "/etc/resolv.conf"),
    ]
    assert all(found.index(m) > etc for m in inside), found
    last_mount = max(i for i, a in enumerate(argv) if a in ("--ro-bind", "--bind", "--symlink"))
    assert argv.index("--remount-ro") > last_mount
    assert argv[argv.index("--remount-ro") + 1] == "/etc"
    assert argv.index("--remount-ro") < argv.index("--chdir")


def test_a_file_of_the_gateways_shown_over_the_teams_is_not_bound_twice():
    lay = team_layout(
        spliced=(("/etc", (("passwd", None), ("group", None))),),
        over=(("/tmp/homes/users/ab12", "/etc/passwd"),),
    )
    found = mounts(bwrap_argv(TEAM, lay, ["claude"], "/"))
    assert [m for m in found if m[-1] == "/etc/passwd"] == [
        ("--ro-bind", "/tmp/homes/users/ab12", "/etc/passwd")
    ]
    assert ("--ro-bind", "/toolchain/etc/group", "/etc/group") in found


def test_the_agents_path_is_path_else_debians_default_and_its_user_is_named():
    lay = team_layout(user="rawp-agent")
    env = sandbox_environment({"PATH": "/gateway/bin", "USER": "gw"}, TEAM, lay)
    assert env["PATH"] == DEFAULT_PATH
    assert env["USER"] == env["LOGNAME"] == "rawp-agent"
    own = replace(TEAM, path="/opt/team/bin:/usr/bin:/bin")
    assert sandbox_environment({}, own, lay)["PATH"] == "/opt/team/bin:/usr/bin:/bin"
    # The gateway's own system: the environment's PATH, as before.
    assert sandbox_environment({"PATH": "/gateway/bin"}, SANDBOX, layout())["PATH"] == (
        "/gateway/bin"
    )
    assert SANDBOX.system == "gateway" and TEAM.system == ROOT


PASSWD = "root:x:0:0:root:/srv/admin:/bin/bash\nrawp:x:999:999::/home/rawp:/bin/sh\n"


def test_a_uid_the_teams_passwd_does_not_know_gets_a_name_and_its_home():
    out = passwd_with(PASSWD, 10001, 10001, "rawp", "/var/lib/rawp/sessions/s1/home")
    assert out is not None and out.startswith(PASSWD)
    # "rawp" is the team's name for another uid: the agent is not made that user.
    assert (
        out.splitlines()[-1] == "rawp-agent:x:10001:10001::/var/lib/rawp/sessions/s1/home:/bin/sh"
    )
    assert passwd_with(PASSWD, 0, 0, "root", "/h") is None  # known: the team's file as it is
    new = passwd_with("", 4242, 4242, "alice", "/h")
    assert new == "alice:x:4242:4242::/h:/bin/sh\n"
    assert passwd_with(PASSWD, 5, 5, "bad:name", "/h").splitlines()[-1].startswith("rawp-agent:")


def test_a_gid_the_teams_group_does_not_know_gets_a_group():
    assert group_with("root:x:0:\n", 0, "root") is None
    assert group_with("root:x:0:\n", 10001, "rawp-agent") == "root:x:0:\nrawp-agent:x:10001:\n"


def test_system_root_and_path_as_written():
    assert check_system_root("/toolchain/", "system_root") == "/toolchain"
    for bad in ("toolchain", "/", "//", "/a\0b", 5):
        with pytest.raises(ValueError):
            check_system_root(bad, "system_root")
    assert check_path("/opt/team/bin:/usr/bin", "path") == "/opt/team/bin:/usr/bin"
    for bad in ("bin:/usr/bin", "/usr/bin:", "/" + "x" * 5000, 3):
        with pytest.raises(ValueError):
            check_path(bad, "path")


def test_a_rebuilt_directory_of_more_entries_than_allowed_is_refused(tmp_path):
    """Showing a gateway's file where the team's system has none rebuilds that directory entry by
    entry, each a mount: past MAX_SPLICE_ENTRIES the agent does not start, with a message that
    says to bind elsewhere; within it, the entries are listed."""
    root = tmp_path / "team"
    (root / "usr" / "bin").mkdir(parents=True)
    for i in range(system.MAX_SPLICE_ENTRIES):
        (root / "usr" / "bin" / f"tool{i}").touch()
    spliced, landed = system.splices(str(root), [("/usr/bin/node", False)])
    assert [(top, len(entries)) for top, entries in spliced] == [
        ("/usr/bin", system.MAX_SPLICE_ENTRIES)
    ]
    assert landed == {"/usr/bin/node": "/usr/bin/node"}
    (root / "usr" / "bin" / "one-more").touch()
    with pytest.raises(AgentStartError, match="bind the gateway's paths outside it"):
        system.splices(str(root), [("/usr/bin/node", False)])
