#!/usr/bin/env bash
# On a machine WITH internet access: build the slim wheel kit that a GPU machine without internet
# access needs (Python 3.12, x86-64 Linux, whose environment already has torch 2.11 cu130,
# transformers 5.17, accelerate 1.15, triton, numpy, pytest, ...). Copy the kit (.whl/) to the GPU
# machine beside the checkout and run benchmarks/gpu_session.sh or benchmarks/gpu_check.sh there.
# What is in the kit, what is left out and why: benchmarks/gpu_wheels.md.
#   bash benchmarks/fetch_gpu_wheels.sh          # DEST=.whl, MAX_MIB=60, PYTHON=python3 by default
# Every file is pinned by version and sha256; --no-deps, so torch and the CUDA libraries are never
# fetched. Three wheels are slimmed (repacked with a fresh RECORD): unsloth without studio/ and
# unsloth_cli/, bitsandbytes with only its CPU and CUDA 13.0 libraries, torchao without its tests.
# The kit is built in a temporary folder and moved into place only when complete; re-running
# replaces it (the same bytes: SHA256SUMS in the kit).
set -euo pipefail
cd "$(dirname "$0")/.."
DEST=${DEST:-.whl}
DEST=${DEST%/}
MAX_MIB=${MAX_MIB:-60}
PY=${PYTHON:-python3}
die() { echo "fetch_gpu_wheels: $*" >&2; exit 1; }
"$PY" -m pip --version >/dev/null 2>&1 || die "$PY has no pip (set PYTHON=...)"

WORK=$(mktemp -d "${TMPDIR:-/tmp}/gpu-wheels.XXXXXX")
trap 'rm -rf "$WORK" "$DEST.partial"' EXIT
rm -rf "$DEST.partial"  # left by a killed run

# sha256 of the files on PyPI; pip only takes a file with one of these hashes.
cat >"$WORK/requirements.txt" <<'EOF'
trl==1.15.0 --hash=sha256:9c9a4b68a184a0b6425293e9b152950f817af686f3758f70191fff4ded1391c7
peft==0.21.2 --hash=sha256:106ab6077ff72c54d21577f9af5970e34bac7582cb14209f7b2b511e322a4eae
datasets==4.8.5 --hash=sha256:5079900781719c0e063a8efdd2cd95a31ad0c63209178669cd23cf1b926149ff
dill==0.4.1 --hash=sha256:1e1ce33e978ae97fcfcff5638477032b801c46c7c65cf717f95fbc2248f79a9d
multiprocess==0.70.19 --hash=sha256:3a56c0e85dd5025161bac5ce138dcac1e49174c7d8e74596537e729fd5c53c28
math-verify==0.9.0 --hash=sha256:3703e7c4885354027fa84409d762a596a2906d1fd4deb78361876bd905a76194
latex2sympy2_extended==1.11.0 --hash=sha256:aebb77d52ce269e25028e4bea89ddb14d242ba36bcf7b636496fb5fd9728d234
antlr4-python3-runtime==4.13.2 --hash=sha256:fe3835eb8d33daece0e799090eda89719dbccee7aa39ef94eed3818cafa5a7e8
bitsandbytes==0.50.2 --hash=sha256:55348a9a4a21bfd99cf8c7b32fe67b4030ae5c2a05738e03c1747f65fa6ec283
unsloth==2026.10.7 --hash=sha256:3ffd1dc001d799eb4ec5a955852f41a3505febb9075504bb2f64a1621c9c7c4e
unsloth_zoo==2026.10.7 --hash=sha256:4161df8e5a057df76278b2270341b5b55fe2138c2bf8cc39b271522616d4959c
torchao==0.18.0 --hash=sha256:5c2b4485341bf28b7fed2c4fc95b9f298e209f41685350f067de85527a05585e
cut_cross_entropy==25.1.1 --hash=sha256:e46f26d348f6a67927d17e65c5a212e795be13dcad5b10a77a200d6b8102d9d1
fsspec==2026.2.0 --hash=sha256:98de475b5cb3bd66bedd5c4679e87b4fdfe1a3bf4d707b151b3c07e58c9a2437
EOF
mkdir "$WORK/kit"
"$PY" -m pip download -q --no-deps --only-binary=:all: --require-hashes --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_24_x86_64 \
  --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform manylinux1_x86_64 --platform any \
  -d "$WORK/kit" -r "$WORK/requirements.txt" 2>"$WORK/pip.log" \
  || { cat "$WORK/pip.log" >&2; die "pip download failed (no network, or a pinned file or hash is gone from PyPI)"; }
[ "$(ls "$WORK/kit"/*.whl | wc -l)" -eq 14 ] || die "expected 14 wheels, got: $(ls "$WORK/kit")"

# wheel.py slim WHEEL DROP_REGEX [NAME=TEXT ...]: remove the entries matching DROP_REGEX, replace NAME's
# content, rewrite RECORD. wheel.py check WHEEL...: every entry is in RECORD with the right hash and size.
cat >"$WORK/wheel.py" <<'EOF'
import base64, csv, hashlib, io, os, re, sys, zipfile

def digest(data):
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()

def slim(path, drop, *sets):
    drop, sets, dropped = re.compile(drop), dict(s.split("=", 1) for s in sets), 0
    with zipfile.ZipFile(path) as zin, zipfile.ZipFile(path + ".tmp", "w", zipfile.ZIP_DEFLATED) as zout:
        record = next(n for n in zin.namelist() if n.endswith(".dist-info/RECORD"))
        rows = []
        for info in zin.infolist():  # original order and timestamps: the result is reproducible
            if info.filename == record or info.is_dir():
                continue
            if drop.fullmatch(info.filename):
                dropped += info.file_size
                continue
            data = sets.pop(info.filename).encode() if info.filename in sets else zin.read(info)
            zout.writestr(info, data)
            rows.append([info.filename, digest(data), len(data)])
        if sets:
            sys.exit(f"fetch_gpu_wheels: {os.path.basename(path)} has no {sorted(sets)}")
        if not dropped:
            sys.exit(f"fetch_gpu_wheels: nothing in {os.path.basename(path)} matched {drop.pattern}")
        out = io.StringIO()
        csv.writer(out, lineterminator="\n").writerows(rows + [[record, "", ""]])
        zout.writestr(zin.getinfo(record), out.getvalue())
    os.replace(path + ".tmp", path)
    print(f"slimmed {os.path.basename(path)}: {dropped / 2**20:.1f} MiB uncompressed removed")

def check(*paths):
    for path in paths:
        with zipfile.ZipFile(path) as z:
            record = next(n for n in z.namelist() if n.endswith(".dist-info/RECORD"))
            rows = {r[0]: r[1:] for r in csv.reader(io.StringIO(z.read(record).decode())) if r}
            files = [i.filename for i in z.infolist() if not i.is_dir()]
            bad = [n for n in files if n != record and rows.get(n) != [digest(z.read(n)), str(z.getinfo(n).file_size)]]
            bad += [n for n in rows if n not in files]
            if bad or z.testzip() is not None:
                sys.exit(f"fetch_gpu_wheels: {os.path.basename(path)}: RECORD does not match {bad[:5]}")

{"slim": slim, "check": check}[sys.argv[1]](*sys.argv[2:])
EOF
# unsloth: studio/ (Unsloth Studio, a web UI: 79 MiB) and unsloth_cli/ (the `unsloth` command) are never
# imported by `import unsloth`; the console script that pointed into unsloth_cli goes with them.
"$PY" "$WORK/wheel.py" slim "$WORK"/kit/unsloth-2026.10.7-*.whl \
  '(studio|unsloth_cli)/.*|unsloth-2026\.10\.7\.dist-info/entry_points\.txt' \
  'unsloth-2026.10.7.dist-info/top_level.txt=unsloth
'
# bitsandbytes: the GPU image's torch is cu130, so only libbitsandbytes_cuda130.so is loaded (the CPU
# library is its fallback without CUDA); the other CUDA, ROCm and XPU builds go.
"$PY" "$WORK/wheel.py" slim "$WORK"/kit/bitsandbytes-0.50.2-*.whl \
  'bitsandbytes/libbitsandbytes_(?!cpu\.so$|cuda130\.so$).*\.so'
# torchao: its wheel also installs its test suite as a top-level package `test`, which on PYTHONPATH
# would shadow the standard library's `test`; nothing imports it.
"$PY" "$WORK/wheel.py" slim "$WORK"/kit/torchao-0.18.0-*.whl 'test/.*' 'torchao-0.18.0.dist-info/top_level.txt=torchao
'
"$PY" "$WORK/wheel.py" check "$WORK"/kit/*.whl
(cd "$WORK/kit" && sha256sum -- *.whl >SHA256SUMS)

BYTES=$(cat "$WORK"/kit/* | wc -c)
MIB=$(awk -v b="$BYTES" 'BEGIN { printf "%.1f", b / 1048576 }')
[ "$BYTES" -le $((MAX_MIB * 1048576)) ] || die "the kit is $MIB MiB, over MAX_MIB=$MAX_MIB"

# Into place: copy beside DEST (same file system), then swap by rename; DEST is never half-built.
cp -r "$WORK/kit" "$DEST.partial"
rm -rf "$DEST.old"
if [ -e "$DEST" ]; then mv "$DEST" "$DEST.old"; fi
mv "$DEST.partial" "$DEST"
rm -rf "$DEST.old"
(cd "$DEST" && ls -l -- *.whl | awk '{ printf "%9.2f MiB  %s\n", $5 / 1048576, $9 }')
echo "fetch_gpu_wheels: $(ls "$DEST"/*.whl | wc -l) wheels in $DEST, $MIB MiB ($BYTES bytes)"
