"""Make a CUDA build of torch import and run on a machine without its CUDA libraries.

PyPI's Linux x86_64 torch wheels (2.11 included) are CUDA builds: libtorch_python.so
links libtorch_cuda.so, which links cuDNN, cuBLAS, NCCL, cuSPARSELt, NVSHMEM, ... (about
1.6 GB of nvidia-* wheels). A CPU run never calls any of them, but the dynamic loader
needs every linked library, symbol version and symbol to exist. This script writes
one small stub library for each such library torch links and cannot find; each stub
function prints its name and aborts, so a stray call fails loudly instead of
silently. libcudart is not stubbed: the real one (nvidia-cuda-runtime, 2 MB) answers
"no device" to torch.cuda.is_available().

    python scripts/torch_cuda_stubs.py TARGET   # TARGET holds torch/ (pip --target)

The stubs go to TARGET/nvidia/cu13/lib, a folder in the RPATH of torch's libraries.
Needs gcc and binutils (readelf, ldd), as torch.compile's CPU backend needs a compiler.
"""

from __future__ import annotations

import re
import subprocess
import sys
import sysconfig
from pathlib import Path

# Loaded when torch is imported; libtorch_cuda_linalg and libcaffe2_nvrtc are
# dlopen()ed only on first CUDA linear algebra / NVRTC use.
LOADED = ["libc10.so", "libc10_cuda.so", "libshm.so", "libtorch.so", "libtorch_cpu.so",
          "libtorch_cuda.so", "libtorch_global_deps.so", "libtorch_nvshmem.so",
          "libtorch_python.so"]


def run(*cmd: str) -> str:
    return subprocess.run(cmd, check=True, capture_output=True, text=True).stdout


def version_needs(lib: Path) -> dict[str, set[str]]:
    """{needed soname: {symbol version names}} from readelf -V."""
    needs: dict[str, set[str]] = {}
    current = None
    for line in run("readelf", "-V", "-W", str(lib)).splitlines():
        m = re.search(r"Version: \d+\s+File: (\S+)", line)
        if m:
            current = needs.setdefault(m.group(1), set())
            continue
        m = re.search(r"Name: (\S+)", line)
        if m and current is not None:
            current.add(m.group(1))
    return needs


def missing(libs: list[Path], target: Path) -> tuple[set[str], set[tuple[str, str | None]]]:
    """(sonames to stub, undefined (symbol, version) pairs) as ldd -r reports them.

    A soname is stubbed when it is not found, or found outside TARGET and outside the
    system's /lib and /usr/lib (say a CUDA toolkit in /usr/local): the environment is
    then the same on every machine."""
    sonames: set[str] = set()
    symbols: set[tuple[str, str | None]] = set()
    for lib in libs:
        out = subprocess.run(["ldd", "-r", str(lib)], capture_output=True, text=True)
        for line in (out.stdout + out.stderr).splitlines():
            m = re.match(r"\s*(\S+) => (not found|\S+)", line)
            if m and (m.group(2) == "not found" or not (
                    m.group(2).startswith(str(target) + "/")
                    or re.match(r"/(usr/)?lib(32|64)?/", m.group(2)))):
                sonames.add(m.group(1))
            m = re.match(r"undefined symbol: ([^,\s]+)(?:, version (\S+))?", line.strip())
            if m:
                symbols.add((m.group(1), m.group(2)))
    return sonames, symbols


def defined_elsewhere(target: Path) -> set[str]:
    """Symbols the Python interpreter (torch._C resolves against it) or torch's own
    libraries define: ldd -r of one library alone reports them undefined when they come
    from a library outside its own dependency tree, which the process has loaded."""
    files = [Path(sys.executable).resolve(), *(target / "torch" / "lib").glob("*.so*")]
    libdir, ldlib = sysconfig.get_config_var("LIBDIR"), sysconfig.get_config_var("LDLIBRARY")
    if libdir and ldlib and (Path(libdir) / ldlib).exists():
        files.append(Path(libdir) / ldlib)
    names = set()
    for f in files:
        for line in run("readelf", "--dyn-syms", "-W", str(f)).splitlines():
            parts = line.split()
            if len(parts) >= 8 and parts[6] != "UND":
                names.add(parts[7].split("@")[0])
    return names


def build(soname: str, versions: set[str], symbols: dict[str, str | None], out: Path) -> None:
    src, script = out / f"{soname}.c", out / f"{soname}.map"
    body = ['#include <stdio.h>', '#include <stdlib.h>',
            'static void die(const char *s) { fprintf(stderr, "tarpo CUDA stub: %s called in a '
            'CPU-only torch environment (%s)\\n", s, "' + soname + '"); abort(); }']
    for name in sorted(symbols):
        body.append(f'void {name}(void) {{ die("{name}"); }}')
    src.write_text("\n".join(body) + "\n")
    nodes = []
    for v in sorted(versions):
        syms = sorted(s for s, sv in symbols.items() if sv == v)
        glob = "".join(f"{s}; " for s in syms)
        nodes.append(f"{v} {{ {'global: ' + glob if glob else ''}}};")
    script.write_text("\n".join(nodes) + "\n")
    cmd = ["gcc", "-shared", "-fPIC", "-O0", "-o", str(out / soname), str(src),
           f"-Wl,-soname,{soname}"]
    if versions:
        cmd.append(f"-Wl,--version-script={script}")
    subprocess.run(cmd, check=True)
    src.unlink()
    script.unlink()


def main(target: Path) -> None:
    lib = target / "torch" / "lib"
    out = target / "nvidia" / "cu13" / "lib"
    out.mkdir(parents=True, exist_ok=True)
    libs = [lib / n for n in LOADED] + list((target / "torch").glob("_C.*.so"))
    libs = [p for p in libs if p.exists()]
    # version nodes each stub must define, from what torch's libraries ask of them
    wanted: dict[str, set[str]] = {}
    for p in libs:
        for soname, vers in version_needs(p).items():
            wanted.setdefault(soname, set()).update(vers)
    # pass 1: empty stubs (right soname and version nodes) so ldd can resolve the graph
    sonames, _ = missing(libs, target)
    for _round in range(5):  # a stub's absence can hide another missing soname
        for s in sonames:
            build(s, wanted.get(s, set()), {}, out)
        more, _ = missing(libs, target)
        if not more - sonames:
            break
        sonames |= more
    if not sonames:
        print("torch_cuda_stubs: nothing missing")
        return
    # pass 2: every symbol still undefined, in the stub of its version, else in one stub
    _, undefined = missing(libs, target)
    python = defined_elsewhere(target)
    by_version = {v: s for s in sonames for v in wanted.get(s, set())}
    catch_all = sorted(sonames)[0]
    per_lib: dict[str, dict[str, str | None]] = {s: {} for s in sonames}
    for name, version in undefined:
        if version is None and name in python:
            continue
        if version is not None and version not in by_version:
            sys.exit(f"torch_cuda_stubs: {name}@{version} is missing from a library not stubbed")
        per_lib[by_version.get(version, catch_all)][name] = version
    for s in sorted(sonames):
        build(s, wanted.get(s, set()), per_lib[s], out)
    left = {u for u in missing(libs, target)[1] if not (u[1] is None and u[0] in python)}
    if left:
        sys.exit(f"torch_cuda_stubs: still undefined: {sorted(left)[:10]}")
    print(f"torch_cuda_stubs: {len(sonames)} stub libraries, "
          f"{sum(map(len, per_lib.values()))} symbols -> {out}")


if __name__ == "__main__":
    main(Path(sys.argv[1]).resolve())
