"""Ninja's records of a restored FlashInfer op, checked with the real ninja binaries on this
machine (Debian's 1.11, log v5 with MurmurHash64A, and the pinned 1.13 wheel, log v7 with
rapidhash): an op built by ninja in one JIT directory, moved to another as a restore moves
it, is rebuilt by ninja without its records and is up to date with the ones written here.

The op is shaped as FlashInfer's ``generate_ninja_build_for_op`` writes it (variables
continued over lines, absolute paths, a ``compile`` and a ``cuda_compile`` rule with gcc-style
deps, a link rule); its "nvcc" is a script of this test that compiles C with gcc."""

from __future__ import annotations

import json
import os
import re
import shutil
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cache_tools import ninja_log
from cache_tools.ninja_build import Unsupported

NINJAS = [p for p in (shutil.which("ninja", path="/usr/bin"),
                      str(Path(sys.executable).with_name("ninja"))) if p and os.path.exists(p)]
pytestmark = [pytest.mark.skipif(not NINJAS, reason="no ninja binary here"),
              pytest.mark.skipif(shutil.which("gcc") is None, reason="no gcc here")]

OP = "norm"


def _toolchain(tmp: Path) -> Path:
    """A CUDA home whose bin/nvcc compiles C with gcc, taking nvcc's dependency flags."""
    home = tmp / "cuda"
    (home / "bin").mkdir(parents=True)
    nvcc = home / "bin" / "nvcc"
    nvcc.write_text('#!/bin/sh\nargs=""\nfor a in "$@"; do\n  case "$a" in\n'
                    '    --generate-dependencies-with-compile) args="$args -MMD";;\n'
                    '    --expt-relaxed-constexpr|--compiler-options=-fPIC) args="$args -fPIC";;\n'
                    '    *) args="$args $a";;\n  esac\ndone\nexec gcc -x c $args\n')
    nvcc.chmod(nvcc.stat().st_mode | stat.S_IEXEC)
    return home


def _sources(tmp: Path) -> list[Path]:
    src = tmp / "site-packages" / "flashinfer" / "csrc"
    src.mkdir(parents=True)
    (src / "norm.h").write_text("int scale(int x);\n")
    (src / "norm.cu").write_text('#include "norm.h"\nint scale(int x) { return 2 * x; }\n')
    (src / "flashinfer_norm_binding.cu").write_text('#include "norm.h"\nint bound(int x) { return scale(x); }\n')
    (src / "helpers.cc").write_text("int helper(void) { return 1; }\n")
    return [src / "norm.cu", src / "flashinfer_norm_binding.cu", src / "helpers.cc"]


def flashinfer_build(jit_dir: Path, sources: list[Path], cuda_home: Path) -> str:
    """build.ninja as FlashInfer 0.6 writes it (flashinfer/jit/cpp_ext.py), for gcc."""
    join = " $\n    ".join
    common = ["-DPy_LIMITED_API=0x03090000", "-D_GLIBCXX_USE_CXX11_ABI=1",
              f"-isystem {sources[0].parent}"]
    out_dir = (jit_dir / OP).absolute()     # as FlashInfer spells it: links not resolved
    lines = ["ninja_required_version = 1.3", f"name = {OP}", f"cuda_home = {cuda_home}",
             "cxx = gcc", "nvcc = $cuda_home/bin/nvcc", "cxx_launcher = ", "nvcc_launcher = ", "",
             "common_cflags = " + join(common), "cflags = " + join(["$common_cflags", "-fPIC", "-O2"]),
             "post_cflags =", "cuda_cflags = " + join(["$common_cflags", "--compiler-options=-fPIC",
                                                      "--expt-relaxed-constexpr", "-O2"]),
             "cuda_post_cflags =", "cuda_arch_flags = ", "ldflags = " + join(["-shared"]), "",
             "rule compile",
             "  command = $cxx_launcher $cxx -MMD -MF $out.d $cflags -c $in -o $out $post_cflags",
             "  depfile = $out.d", "  deps = gcc", "",
             "rule cuda_compile",
             "  command = $nvcc_launcher $nvcc --generate-dependencies-with-compile -MF $out.d "
             "$cuda_cflags -c $in -o $out $cuda_post_cflags",
             "  depfile = $out.d", "  deps = gcc", "",
             "rule link", "  command = $cxx $in $ldflags -o $out", ""]
    objects = []
    for source in sources:
        cuda = source.suffix == ".cu"
        obj = str(out_dir / f"{source.parent.name}_{source.stem}{'.cuda.o' if cuda else '.o'}")
        objects.append(obj)
        lines.append(f"build {obj}: {'cuda_compile' if cuda else 'compile'} {source.resolve()}")
    so = str(out_dir / f"{OP}.so")
    lines += ["", f"build {so}: link " + " ".join(objects), f"default {so}", ""]
    return "\n".join(lines)


def run_ninja(ninja: str, jit_dir: Path, *extra: str, workdir: str = "jit") -> str:
    """What FlashInfer runs: ninja -C <op dir or jit dir> -f <jit dir>/<op>/build.ninja (the op's
    own directory in 0.6, one set of records per op; the JIT directory of every op before)."""
    where = jit_dir / OP if workdir == "op" else jit_dir
    done = subprocess.run([ninja, "-C", str(where.resolve()), "-f",
                           str((jit_dir / OP / "build.ninja").resolve()), *extra],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout + done.stderr


@pytest.fixture
def built(tmp_path):
    """An op built by ninja under bake/…/cached_ops (the bake), and the toolchain."""
    cuda, sources = _toolchain(tmp_path), _sources(tmp_path)
    old = tmp_path / "bake" / "0.6.15" / "90a" / "cached_ops"
    (old / OP).mkdir(parents=True)
    (old / OP / "build.ninja").write_text(flashinfer_build(old, sources, cuda))
    return old, cuda, sources


def relocate(old: Path, new_base: Path) -> Path:
    """The op's directory alone moved under another JIT directory, as a restore leaves it (the
    depfiles are gone after a build: ninja folds them into its deps log)."""
    new = new_base / "0.6.15" / "90a" / "cached_ops"
    new.mkdir(parents=True)
    shutil.copytree(old / OP, new / OP)
    return new


def would_run(ninja: str, jit_dir: Path, workdir: str = "jit") -> list[str]:
    out = run_ninja(ninja, jit_dir, "-n", workdir=workdir)
    return [line for line in out.splitlines() if line.startswith("[")]


@pytest.mark.parametrize("ninja", NINJAS)
def test_probe_learns_the_formats_of_the_ninja_here(ninja):
    formats = ninja_log.probe(ninja)
    assert formats is not None
    version = subprocess.run([ninja, "--version"], capture_output=True, text=True).stdout
    expected = "murmur64a" if version.startswith(("1.10", "1.11", "1.12")) else "rapidhash"
    assert formats.hash_name == expected and formats.deps_version == 4
    assert formats.log_header.startswith(b"# ninja log v")


@pytest.mark.parametrize("ninja", NINJAS)
def test_a_relocated_op_is_rebuilt_without_records_and_not_with_them(ninja, built, tmp_path):
    workdir = "op"
    old, _, _ = built
    run_ninja(ninja, old, workdir=workdir)
    assert would_run(ninja, old, workdir) == []            # up to date where it was built
    bare = relocate(old, tmp_path / "bare")
    # what the H200 showed: the op's files all there (in FlashInfer 0.6 ninja's records too,
    # naming the bake's paths), yet ninja builds all four again
    (bare / OP / "build.ninja").write_text(
        (old / OP / "build.ninja").read_text().replace(str(old.resolve()), str(bare.resolve())))
    assert len(would_run(ninja, bare, workdir)) == 4

    new = relocate(old, tmp_path / "restored")
    before = {p.name: p.read_bytes() for p in (new / OP).iterdir()}
    line = ninja_log.record_op(new / OP, ninja_log.probe(ninja))
    assert line.startswith(f"ninja's records written for 4 output(s) in {(new / OP).resolve()}, "
                           "build.ninja moved from ")
    assert would_run(ninja, new, workdir) == []
    assert "no work to do" in run_ninja(ninja, new, workdir=workdir)
    assert (new / OP / "norm.so").read_bytes() == before["norm.so"]
    # what FlashInfer writes on load is what the op now holds (its write_if_different keeps it)
    assert (new / OP / "build.ninja").read_text() == flashinfer_build(new, built[2], built[1])


@pytest.mark.parametrize("ninja", NINJAS)
def test_an_op_restored_under_a_linked_directory_keeps_the_path_flashinfer_uses(ninja, built,
                                                                               tmp_path):
    """FlashInfer spells its workspace as its variable or HOME give it, through any link: the
    records name the op by that path, not the resolved one, or ninja builds it again."""
    old, cuda, sources = built
    run_ninja(ninja, old, workdir="op")
    relocate(old, tmp_path / "real")
    (tmp_path / "link").symlink_to(tmp_path / "real")
    linked = tmp_path / "link" / "0.6.15" / "90a" / "cached_ops"
    ninja_log.record_op(linked / OP, ninja_log.probe(ninja))
    # what FlashInfer writes on load, and the ninja it runs, both with the linked path
    assert (linked / OP / "build.ninja").read_text() == flashinfer_build(linked, sources, cuda)
    done = subprocess.run([ninja, "-C", str(linked / OP), "-f", str(linked / OP / "build.ninja"),
                           "-n"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert [x for x in done.stdout.splitlines() if x.startswith("[")] == []


@pytest.mark.parametrize("changed", ["helpers.cc", "norm.h"])
@pytest.mark.parametrize("ninja", NINJAS)
def test_the_records_still_let_ninja_see_a_changed_source_or_header(ninja, changed, built,
                                                                    tmp_path):
    old, _, sources = built
    run_ninja(ninja, old, workdir="op")
    new = relocate(old, tmp_path / "restored")
    ninja_log.record_op(new / OP, ninja_log.probe(ninja))
    assert would_run(ninja, new, "op") == []
    later = time.time() + 5
    os.utime(sources[0].parent / changed, (later, later))
    # helpers.o and the link; the two objects whose compile read norm.h and the link
    assert len(would_run(ninja, new, "op")) == {"helpers.cc": 2, "norm.h": 3}[changed]


@pytest.mark.parametrize("ninja", NINJAS)
def test_an_op_restored_at_its_own_path_gets_records_too(ninja, built):
    """A restore writes every file anew: newer than the times ninja recorded, so ninja would
    rebuild even where the op was baked."""
    old, _, _ = built
    run_ninja(ninja, old, workdir="op")
    later = time.time_ns() + 3 * 10**9
    for f in (old / OP).iterdir():
        os.utime(f, ns=(later, later))
    assert len(would_run(ninja, old, "op")) == 4
    assert "build.ninja moved" not in ninja_log.record_op(old / OP, ninja_log.probe(ninja))
    assert would_run(ninja, old, "op") == []


@pytest.mark.parametrize("ninja", NINJAS)
def test_an_op_without_records_of_its_own_is_left_alone(ninja, built, tmp_path):
    """Ninja run in the JIT directory (FlashInfer before 0.6): the op carries no records, the
    headers its objects read are unknown, so none are written and ninja builds it again."""
    old, _, _ = built
    run_ninja(ninja, old, workdir="jit")
    new = relocate(old, tmp_path / "restored")
    text = (new / OP / "build.ninja").read_text()
    with pytest.raises(Unsupported, match="the op carries no build log"):
        ninja_log.record_op(new / OP, ninja_log.probe(ninja))
    assert (new / OP / "build.ninja").read_text() == text
    assert sorted(os.listdir(new)) == [OP] and not (new / OP / ".ninja_log").exists()


@pytest.mark.parametrize("text, message", [
    ("include other.ninja\n", "'include' is not what FlashInfer writes"),
    ("rule r\n  command = x\n  rspfile = $out.rsp\nbuild a: r b\ndefault a\n",
     "rule r has bindings not written here"),
    ("rule r\n  command = x\nbuild a: r b | c\ndefault a\n", "implicit or order-only paths"),
    ("rule r\n  command = x\nbuild a r b\n", "a build line without ':'"),
    ("  command = x\n", "an indented line outside a rule or build"),
    ("rule r\n  command = x $%\nbuild a: r b\ndefault a\n", "an escape ninja would refuse"),
    ("build a: nothing b\ndefault a\n", "no rule 'nothing'"),
    ("v0 = xxxxxxxxxxxxxxxx\n" + "".join(f"v{i} = $v{i - 1}$v{i - 1}\n" for i in range(1, 60)),
     "more than 4,194,304 characters evaluated"),
    ("rule r\n  command = $depfile\n  depfile = a$command\nbuild a: r b\ndefault a\n",
     "$depfile refers to itself"),
    ("rule r\n  command = $x\n  x = a\nbuild a: r b\ndefault a\n", "a rule binding ninja refuses: 'x'"),
    # a default that is relative, or not an output, would move unrelated paths
    ("rule r\n  command = x\nbuild q/norm/norm.so: r b\ndefault q/norm/norm.so\n",
     "its default is not the output"),
    ("rule r\n  command = x\nbuild /j/norm/a.so: r b\ndefault /j/norm/norm.so\n",
     "its default is not the output"),
    ("rule r\n  command = x\n  deps = msvc\nbuild /j/norm/norm.so: r b\ndefault /j/norm/norm.so\n",
     "deps = 'msvc', not gcc"),
    ("v = a\n" + "".join(f"w{i} = " + f"$w{i - 1}" * 60 + "\n" for i in range(1, 8)).replace("$w0", "$v"),
     "more than 4,194,304 characters evaluated"),
])
def test_a_build_file_not_shaped_as_flashinfer_writes_it_is_left_alone(tmp_path, text, message):
    op = tmp_path / "cached_ops" / OP
    op.mkdir(parents=True)
    (op / "build.ninja").write_text(text)
    with pytest.raises(Unsupported, match=message.replace("(", r"\(").replace("$", r"\$")):
        ninja_log.record_op(op, ninja_log.Formats("ninja", b"# ninja log v5\n", "murmur64a", 4))
    assert sorted(os.listdir(tmp_path / "cached_ops")) == [OP]


def test_a_build_file_above_its_limit_is_left_alone(tmp_path):
    op = tmp_path / "cached_ops" / OP
    op.mkdir(parents=True)
    (op / "build.ninja").write_text("#" * (ninja_log.MAX_BUILD_FILE + 1))
    with pytest.raises(Unsupported, match=r"build.ninja: 1,048,577 bytes \(limit 1,048,576\)"):
        ninja_log.record_op(op, ninja_log.Formats("ninja", b"# ninja log v5\n", "murmur64a", 4))


def test_an_op_whose_outputs_lie_elsewhere_or_are_missing_is_left_alone(built, tmp_path):
    old, cuda, sources = built
    new = relocate(old, tmp_path / "restored")
    formats = ninja_log.Formats("ninja", b"# ninja log v5\n", "murmur64a", 4)
    with pytest.raises(Unsupported, match="an output is missing from the op"):
        ninja_log.record_op(new / OP, formats)              # never built: no objects
    (new / OP / "build.ninja").write_text(flashinfer_build(new, sources, cuda).replace(
        f"build {(new / OP).resolve()}/csrc_helpers.o", "build /etc/helpers.o"))
    with pytest.raises(Unsupported, match="an output outside"):
        ninja_log.record_op(new / OP, formats)
    assert not (new / ".ninja_log").exists() and not (new / ".ninja_deps").exists()


@pytest.mark.parametrize("record", [".ninja_log", ".ninja_deps", "build.ninja"])
@pytest.mark.parametrize("what", ["link", "dangling", "fifo"])
def test_records_that_are_not_regular_files_are_left_alone(built, tmp_path, what, record):
    """A restored op whose build file or records are a link (to a file elsewhere, or to
    nothing) or a FIFO: nothing followed, nothing created, no hang."""
    old, _, _ = built
    run_ninja(NINJAS[0], old, workdir="op")
    new = relocate(old, tmp_path / "restored")
    path = new / OP / record
    outside = tmp_path / "outside"
    path.unlink()
    if what == "link":
        outside.write_bytes(b"# ninja log v5\n")
        path.symlink_to(outside)
    elif what == "dangling":
        path.symlink_to(outside)
    else:
        os.mkfifo(path)
    started = time.monotonic()
    with pytest.raises(Unsupported, match=f"{re.escape(record)} is not a regular file"):
        ninja_log.record_op(new / OP, ninja_log.probe(NINJAS[0]))
    assert time.monotonic() - started < 10
    if what == "link":
        assert outside.read_bytes() == b"# ninja log v5\n"
    else:
        assert not outside.exists()


def test_an_input_that_is_not_here_leaves_the_op_alone(built, tmp_path):
    """A source under the workspace's generated/ that the restore did not bring (or a package
    source missing here): ninja could not build it either; nothing is written."""
    old, _, sources = built
    run_ninja(NINJAS[0], old, workdir="op")
    new = relocate(old, tmp_path / "restored")
    sources[2].unlink()
    with pytest.raises(Unsupported, match=f"its input {sources[2].resolve()} is not here"):
        ninja_log.record_op(new / OP, ninja_log.probe(NINJAS[0]))
    assert "/restored/" not in (new / OP / "build.ninja").read_text()


def test_no_ninja_means_no_records(tmp_path):
    assert ninja_log.probe(str(tmp_path / "absent")) is None
    fake = tmp_path / "ninja"
    fake.write_text("#!/bin/sh\nexit 0\n")
    fake.chmod(0o755)
    assert ninja_log.probe(str(fake)) is None               # ran, wrote no records


@pytest.mark.parametrize("ninja", NINJAS)
def test_the_hash_is_ninjas_at_every_length(ninja, tmp_path):
    """Commands of 9 to 140 bytes (every branch of both hashes: up to 16, 48 and 96 bytes and
    past them) built by the real ninja: the hash it logged is the one computed here."""
    lines, commands = [], {}
    for n in range(9, 141):
        command = f"touch o{n} #" + "x" * (n - len(f"touch o{n} #"))
        commands[f"o{n}"] = command
        lines += [f"rule r{n}", f"  command = {command}", f"build o{n}: r{n}", ""]
    (tmp_path / "build.ninja").write_text("\n".join(lines))
    subprocess.run([ninja, "-C", str(tmp_path)], check=True, capture_output=True, timeout=120)
    formats = ninja_log.probe(ninja)
    logged = {f[3].decode(): int(f[4], 16) for f in
              (line.split(b"\t") for line in (tmp_path / ".ninja_log").read_bytes().splitlines()[1:])}
    assert len(logged) == len(commands)
    assert all(formats.hash(commands[out]) == h for out, h in logged.items())


def test_the_hashes_of_the_probe_command():
    """What ninja 1.11 (MurmurHash64A) and 1.13 (rapidhash) logged for the probe's command."""
    command = b"touch out && echo out: > out.d"
    assert ninja_log.murmur64a(command) == 0x179C5D09D6955A26
    assert ninja_log.rapidhash(command) == 0x62E99188F011EE98


# --- through the cache commands: pack, restore under another root, load -----------------------
ON_PATH = shutil.which("ninja")


def _baked_root(tmp_path: Path, ninja: str) -> tuple[Path, Path]:
    """A --root layout whose FlashInfer cache holds the op, built there by ninja in the op's
    directory, as FlashInfer 0.6 builds it (its records then travel in the archive)."""
    root = tmp_path / "bake"
    jit = root / ".cache" / "flashinfer" / "0.6.15" / "90a" / "cached_ops"
    (jit / OP).mkdir(parents=True)
    (jit / OP / "build.ninja").write_text(
        flashinfer_build(jit, _sources(tmp_path), _toolchain(tmp_path)))
    run_ninja(ninja, jit, workdir="op")
    return root, jit


@pytest.mark.skipif(ON_PATH is None, reason="no ninja on PATH (the one FlashInfer runs)")
def test_a_restored_flashinfer_op_is_not_built_again(tmp_path, capsys):
    from _cli import cli

    ninja_log.probe.cache_clear()
    root, _ = _baked_root(tmp_path, ON_PATH)
    archive = tmp_path / "a.tar"
    code, _, err = cli(capsys, "cache", "pack", str(archive), "--root", str(root), "--kinds",
                       "flashinfer", "-q")
    assert code == 0, err
    dest = tmp_path / "elsewhere"
    code, out, err = cli(capsys, "cache", "restore", str(archive), "--dest", str(dest),
                         "--format", "json", "-q")
    assert code == 0, err
    [op] = [o for o in json.loads(out)["outcomes"] if o["kind"] == "flashinfer"]
    assert op["status"] == "added"
    new_jit = dest / ".cache" / "flashinfer" / "0.6.15" / "90a" / "cached_ops"
    assert op["detail"].startswith(f"ninja's records written for 4 output(s) in "
                                   f"{(new_jit / OP).resolve()}, build.ninja moved")
    assert would_run(ON_PATH, new_jit, "op") == []


def test_without_a_ninja_the_restore_says_the_op_will_be_built_again(tmp_path, capsys,
                                                                      monkeypatch):
    from _cli import cli

    if not NINJAS:
        pytest.skip("no ninja to bake with")
    root, baked_jit = _baked_root(tmp_path, NINJAS[0])
    archive = tmp_path / "a.tar"
    assert cli(capsys, "cache", "pack", str(archive), "--root", str(root), "-q")[0] == 0
    monkeypatch.setenv("PATH", str(tmp_path / "no-tools"))
    ninja_log.probe.cache_clear()
    try:
        code, out, err = cli(capsys, "cache", "restore", str(archive), "--dest",
                             str(tmp_path / "d"))
    finally:
        ninja_log.probe.cache_clear()
    assert code == 0, err
    target = tmp_path / "d" / ".cache" / "flashinfer" / "0.6.15" / "90a" / "cached_ops" / OP
    assert ("warning: 1 FlashInfer op(s) without ninja's records: FlashInfer's ninja builds each "
            "again at its first load (restore where the server runs, with its ninja on PATH)\n"
            f"  {target}: no ninja here whose records this tool writes") in out + err
    assert not (target.parent / ".ninja_log").exists()
    assert (target / ".ninja_log").read_bytes() == (baked_jit / OP / ".ninja_log").read_bytes()


# --- any text at all --------------------------------------------------------------------------
_NINJA_WORDS = st.sampled_from(["rule r", "build a: r b", "build $out: r $in", "default a",
                                "  command = $x$$y ${z}", "  deps = gcc", "  depfile = $out.d",
                                "x = $x$x", "include f", "pool p", "  x = $command", "# c $",
                                "a = b $", "build a$ b: r c | d", "  rspfile = r", "$", "${",
                                "v = $v"])


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.one_of(_NINJA_WORDS, st.text(max_size=30)), max_size=40))
def test_any_build_file_parses_or_is_refused_in_one_line(lines):
    from cache_tools import ninja_build

    try:
        edges, defaults = ninja_build.parse("\n".join(lines))
    except Unsupported as exc:
        assert "\n" not in str(exc)
    else:
        assert all(isinstance(e.command, str) for e in edges)
        assert all(isinstance(d, str) for d in defaults)


# --- commands as ninja evaluates them ---------------------------------------------------------
@pytest.mark.parametrize("ninja", NINJAS)
@pytest.mark.parametrize("text", [
    # a value keeps its trailing spaces (FlashInfer's joined flag lists can end with one)
    "v = x  \nrule r\n  command = echo $v$v\nbuild a: r b\n",
    "rule r\n  command = echo $f  \nbuild a: r b\n  f = y  \n",
    # a build's own binding is evaluated where it stands, not at the end of the file
    "v = 1\nrule r\n  command = echo $w $v\nbuild a: r b\n  w = $v\nv = 2\n",
    # $$ is a dollar: the space, colon or bar after it separates
    "rule r\n  command = echo $in\nbuild a: r b$$ c\n",
    "rule r\n  command = echo $out $in\nbuild a$$: r c\n",
    "rule r\n  command = echo $in\nbuild a: r b$ c$:d\n",
    "rule r\n  command = echo $in x$$y ${in}\nbuild a: r b\n",
])
def test_commands_are_evaluated_as_ninja_evaluates_them(ninja, tmp_path, text):
    """The command hash is of the command ninja evaluates: spaces, scopes and escapes as its."""
    from cache_tools import ninja_build

    (tmp_path / "build.ninja").write_text(text)
    edges, _ = ninja_build.parse(text)
    done = subprocess.run([ninja, "-C", str(tmp_path), "-t", "commands", edges[0].outputs[0]],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert [e.command for e in edges] == done.stdout.split("\n")[:-1]


@pytest.mark.parametrize("record", [".ninja_deps", "build.ninja"])
def test_a_link_put_in_place_after_the_check_is_refused_by_the_open(built, tmp_path, monkeypatch,
                                                                     record):
    """The regular-file check and the read are two calls; a link that appears between them is
    refused by the read's own open (O_NOFOLLOW), and its target is never read."""
    old, _, _ = built
    run_ninja(NINJAS[0], old, workdir="op")
    new = relocate(old, tmp_path / "restored")
    path = new / OP / record
    outside = tmp_path / "outside"
    outside.write_bytes(path.read_bytes())
    path.unlink()
    path.symlink_to(outside)
    log_before = (new / OP / ".ninja_log").read_bytes()
    monkeypatch.setattr(ninja_log, "_regular", lambda path, what: None)
    with pytest.raises(Unsupported, match=f"{re.escape(record)}: is a symbolic link$"):
        ninja_log.record_op(new / OP, ninja_log.probe(NINJAS[0]))
    assert (new / OP / ".ninja_log").read_bytes() == log_before  # nothing written

