#!/usr/bin/env bash
# Fill the git-ignored folders that experiments/benchmarks/gpu_check.sh needs on a device machine whose image lacks
# them (it has torch+CUDA, numpy, scipy, numba, tensorboard, matplotlib, pytest, hypothesis, PyYAML, opt-einsum,
# but no Hydra/OmegaConf/Opacus and no network):
#   .gpu_pylibs/  pure-Python packages copied from THIS machine's site-packages (no pip, no download):
#                 hydra, omegaconf, antlr4 (antlr4-python3-runtime), opacus, yaml, packaging, opt_einsum, with
#                 their dist-info, so that `python -S` imports Hydra from the folder alone (the image's
#                 own pytest and hypothesis are used: this machine's hypothesis has C extensions for another Python);
#   .gpu_data/    ML-1M's ratings.dat and movies.dat (the public item features), ML-100K's u.data, u1-u5 splits and u.item,
#                 from $DPREC_DATA.
# Both travel with the working tree as `carry` paths (64 MiB in all; this is ~35 MiB):
#   run(command="bash experiments/benchmarks/gpu_check.sh", carry=[".gpu_pylibs", ".gpu_data"])
# Usage: DPREC_DATA=/work/shared/data bash experiments/benchmarks/prepare_gpu_pylibs.sh [dest_root]
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
DEST="${1:-$ROOT}"
python - "$DEST" <<'PY'
import importlib.metadata as md, importlib.util, json, shutil, sys
from pathlib import Path

dest = Path(sys.argv[1]) / ".gpu_pylibs"
# top-level import names -> distribution; C-extension-free (PyYAML's optional _yaml falls back to pure Python)
PACKAGES = {
    "hydra": "hydra-core", "omegaconf": "omegaconf", "antlr4": "antlr4-python3-runtime", "opacus": "opacus",
    "yaml": "PyYAML", "packaging": "packaging", "opt_einsum": "opt-einsum",  # in the image too; pure Python copies
}
if dest.exists():
    shutil.rmtree(dest)
dest.mkdir(parents=True)
ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "tests", "*.so")
copied, dists = [], set()
for mod, dist in PACKAGES.items():
    spec = importlib.util.find_spec(mod)
    if spec is None or spec.origin in (None, "built-in"):
        continue
    src = Path(spec.origin)
    if src.name == "__init__.py":
        shutil.copytree(src.parent, dest / mod, ignore=ignore)
    else:
        shutil.copy2(src, dest / src.name)
    copied.append(mod)
    dists.add(dist)
versions = {}
for dist in sorted(dists):
    try:
        d = md.distribution(dist)
    except md.PackageNotFoundError:
        continue
    versions[dist] = d.version
    info = Path(d._path)  # the .dist-info folder: importlib.metadata.version() works on the device too
    if info.is_dir():
        shutil.copytree(info, dest / info.name, ignore=ignore)
(dest / "MANIFEST.json").write_text(json.dumps({"python": sys.version.split()[0], "modules": copied, "versions": versions}, indent=2))
size = sum(p.stat().st_size for p in dest.rglob("*") if p.is_file())
print(f"{dest}: {len(copied)} modules, {size / 2**20:.1f} MiB ({', '.join(f'{k} {v}' for k, v in versions.items())})")
PY
DATA="${DPREC_DATA:-}"
if [ -n "$DATA" ] && [ -f "$DATA/ml-1m/ratings.dat" ]; then
  mkdir -p "$DEST/.gpu_data/ml-1m" "$DEST/.gpu_data/ml-100k"
  cp "$DATA/ml-1m/ratings.dat" "$DATA/ml-1m/movies.dat" "$DEST/.gpu_data/ml-1m/"
  for f in u.data u1.base u1.test u2.base u2.test u3.base u3.test u4.base u4.test u5.base u5.test u.item u.genre; do
    [ -f "$DATA/ml-100k/$f" ] && cp "$DATA/ml-100k/$f" "$DEST/.gpu_data/ml-100k/"
  done
  echo "$DEST/.gpu_data: $(du -sh "$DEST/.gpu_data" | cut -f1)"
else
  echo "no \$DPREC_DATA/ml-1m/ratings.dat: the ML-1M rows will be skipped" >&2
fi
