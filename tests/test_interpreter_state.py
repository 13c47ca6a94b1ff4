"""The comparison of what an interpreter runs at start, and the end of what a build left running (adversarial R2),
on a real venv and real processes, without a build (test_build.py runs the same attacks through a real one)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from ci.building import interpreter_state, orphans, toolchain


def _venv(tmp_path: Path) -> tuple[Path, Path]:
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    site = venv / "lib" / f"python{sys.version_info[0]}.{sys.version_info[1]}" / "site-packages"
    (site / "wheelhouse_probe.py").write_text("# a module of the interpreter" + "." * 200 + "\nVALUE = 1\n")
    (venv / "bin" / "tool-entry").write_text(f"#!{venv / 'bin' / 'python'}\nprint('tool')\n")
    return venv, site


def test_same_size_same_mtime_rewrites_bin_and_pyvenv_cfg_and_bytecode_are_all_found(tmp_path):
    venv, site = _venv(tmp_path)
    paths = [interpreter_state.start_paths(venv / "bin" / "python", toolchain.interpreter_environment())]
    assert site in paths[0].directories and venv / "bin" in paths[0].directories
    assert venv / "pyvenv.cfg" in paths[0].files
    before = interpreter_state.snapshot(paths)

    module = site / "wheelhouse_probe.py"  # R2 (a): same size, mtime put back
    stat = module.stat()
    text = module.read_text()
    head = text.split("\n", 1)[0]
    module.write_text("import os; os.system('id')#".ljust(len(head), "x") + text[len(head):])
    os.utime(module, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    assert (module.stat().st_size, module.stat().st_mtime_ns) == (stat.st_size, stat.st_mtime_ns)
    entry = venv / "bin" / "tool-entry"  # R2 (b)
    entry.write_text(entry.read_text().replace("print", "import os; print"))
    with open(venv / "pyvenv.cfg", "a") as cfg:  # variant: pyvenv.cfg
        cfg.write("include-system-site-packages = true\n")
    (site / "zzz.pth").write_text("import os\n")  # variant: an added .pth
    (site / "__pycache__").mkdir(exist_ok=True)
    (site / "__pycache__" / "wheelhouse_probe.cpython-311.pyc").write_bytes(b"planted")  # variant: bytecode

    changes = interpreter_state.compare(before, interpreter_state.snapshot(paths))
    assert changes.added == (str(site / "zzz.pth"),)
    assert set(changes.altered) == {str(module), str(entry), str(venv / "pyvenv.cfg")}
    assert changes.bytecode == (str(site / "__pycache__" / "wheelhouse_probe.cpython-311.pyc"),)
    done = interpreter_state.take_back(changes)
    assert done[0] == f"removed what it added ({site / 'zzz.pth'})"
    assert not (site / "zzz.pth").exists() and not module.exists()
    assert Path(str(module) + ".changed-by-build").is_file()
    run = subprocess.run([str(venv / "bin" / "python"), "-c", "import wheelhouse_probe"], capture_output=True, text=True)
    assert "ModuleNotFoundError" in run.stderr  # the altered module no longer runs; it is to be reinstalled


def test_a_large_file_is_compared_by_what_no_process_can_set_back(tmp_path):
    big = tmp_path / "lib.so"
    big.write_bytes(b"\0" * (interpreter_state.DIGESTED_BYTES + 1))
    paths = [interpreter_state.StartPaths(Path(sys.executable), (tmp_path,), ())]
    before = interpreter_state.snapshot(paths)
    stat = big.stat()
    with open(big, "r+b") as fp:  # one byte changed, size and mtime put back
        fp.write(b"\1")
    os.utime(big, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    assert interpreter_state.compare(before, interpreter_state.snapshot(paths)).altered == (str(big),)


def test_a_large_file_linked_into_another_venv_meanwhile_is_unchanged(tmp_path):
    """uv links one cached file into every venv of its wheel: a venv made beside a running build moves the ctime
    of the build's torch libraries (parallel builds failed on it) without changing a byte."""
    venv, cache, other = (tmp_path / name for name in ("venv", "uv-cache", "other-venv"))
    for folder in (venv, cache, other):
        folder.mkdir()
    cached = cache / "libtorch.so"
    cached.write_bytes(b"\0" * (interpreter_state.DIGESTED_BYTES + 1))
    os.link(cached, venv / "libtorch.so")
    paths = [interpreter_state.StartPaths(Path(sys.executable), (venv,), ())]
    before = interpreter_state.snapshot(paths)
    time.sleep(0.01)
    os.link(cached, other / "libtorch.so")  # another venv made from the cache
    assert not interpreter_state.compare(before, interpreter_state.snapshot(paths))
    (other / "libtorch.so").unlink()
    with open(venv / "libtorch.so", "r+b") as fp:  # the same links, one byte written, the mtime put back
        fp.write(b"\1")
    os.utime(venv / "libtorch.so", ns=(before[str(venv / "libtorch.so")].fixed[1],) * 2)
    assert interpreter_state.compare(before, interpreter_state.snapshot(paths)).altered == (str(venv / "libtorch.so"),)


def test_a_large_file_whose_link_came_and_went_meanwhile_is_unchanged_by_its_record(tmp_path):
    """A venv made from uv's cache and deleted again while the build ran leaves the link count as it was and the
    ctime moved (parallel builds failed on it): the file's sha256 against its distribution's RECORD decides. A
    write in place with the mtime put back still differs from RECORD; so does a RECORD the build rewrote."""
    import base64
    import hashlib

    site, cache, other = (tmp_path / name for name in ("site-packages", "uv-cache", "other-venv"))
    for folder in (site, cache, other):
        folder.mkdir()
    cached = cache / "libtorch.so"
    cached.write_bytes(b"\0" * (interpreter_state.DIGESTED_BYTES + 1))
    (site / "torch").mkdir()
    library = site / "torch" / "libtorch.so"
    os.link(cached, library)
    digest = base64.urlsafe_b64encode(hashlib.sha256(cached.read_bytes()).digest()).rstrip(b"=").decode()
    (site / "torch-2.13.0.dist-info").mkdir()
    record = site / "torch-2.13.0.dist-info" / "RECORD"
    record.write_text(f"torch/libtorch.so,sha256={digest},{cached.stat().st_size}\ntorch-2.13.0.dist-info/RECORD,,\n")
    paths = [interpreter_state.StartPaths(Path(sys.executable), (site,), ())]
    before = interpreter_state.snapshot(paths)
    time.sleep(0.01)
    os.link(cached, other / "libtorch.so")  # another venv made from the cache, and deleted
    (other / "libtorch.so").unlink()
    after = interpreter_state.snapshot(paths)
    assert after[str(library)].fixed[2] != before[str(library)].fixed[2]  # the ctime moved, the links did not
    assert after[str(library)].fixed[5] == before[str(library)].fixed[5]
    assert not interpreter_state.compare(before, after)

    with open(library, "r+b") as fp:  # one byte written, the mtime put back
        fp.write(b"\1")
    os.utime(library, ns=(before[str(library)].fixed[1],) * 2)
    assert interpreter_state.compare(before, interpreter_state.snapshot(paths)).altered == (str(library),)
    record.write_text(record.read_text().replace(digest, base64.urlsafe_b64encode(
        hashlib.sha256(library.read_bytes()).digest()).rstrip(b"=").decode()))  # and RECORD made to match it
    assert interpreter_state.compare(before, interpreter_state.snapshot(paths)).altered == (str(record), str(library))


def test_a_detached_process_the_block_left_is_ended_before_it_writes(tmp_path):
    late = tmp_path / "late.pth"
    daemon = f"import time; time.sleep(3); open({str(late)!r}, 'w').write('x')"
    with orphans.adopted() as ended:
        subprocess.run([sys.executable, "-c", "import subprocess, sys; subprocess.Popen([sys.executable, '-c', "
                        f"{daemon!r}], start_new_session=True)"], check=True)
    assert len(ended) == 1
    time.sleep(4)
    assert not late.exists()
    with orphans.adopted() as ended:  # a child the caller had before the block is not the block's
        pass
    assert ended == []


def test_a_directory_of_sys_path_that_holds_the_checkout_is_not_watched(tmp_path):
    """PYTHONPATH=. in the checkout puts the repository on sys.path: a person edits it during a long build, and the
    build's own cache and output change in it by design; it is not an interpreter's (README: not covered)."""
    checkout = tmp_path / "checkout"
    (checkout / ".cache").mkdir(parents=True)
    (checkout / "notes.py").write_text("x = 1\n")
    site = tmp_path / "site-packages"
    site.mkdir()
    (site / "mod.py").write_text("y = 1\n")
    paths = [interpreter_state.StartPaths(Path(sys.executable), (checkout, site), ())]
    before = interpreter_state.snapshot(paths, skip=(checkout,))
    assert str(site / "mod.py") in before and str(checkout / "notes.py") not in before
