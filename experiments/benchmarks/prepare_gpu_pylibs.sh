#!/usr/bin/env bash
# Fill the git-ignored folders that experiments/benchmarks/gpu_check.sh needs on a device machine whose image lacks
# them (it has torch+CUDA, numpy, scipy, numba, tensorboard, matplotlib, but no Hydra/OmegaConf/Opacus,
# no pytest and no network):
#   .gpu_pylibs/  pure-Python packages copied from THIS machine's site-packages (no pip, no download):
#                 hydra, omegaconf, antlr4 (antlr4-python3-runtime), yaml, packaging, opacus, opt_einsum,
#                 pytest and its pure deps, hypothesis (+ sortedcontainers, attrs), with their dist-info;
#   .gpu_data/ml-1m/  the ML-1M files (ratings.dat is all the loader reads), from $DPREC_DATA.
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
    "hydra": "hydra-core", "omegaconf": "omegaconf", "antlr4": "antlr4-python3-runtime", "yaml": "PyYAML",
    "packaging": "packaging", "opacus": "opacus", "opt_einsum": "opt-einsum",
    "pytest": "pytest", "_pytest": "pytest", "py": "pytest", "pluggy": "pluggy", "iniconfig": "iniconfig",
    "pygments": "Pygments", "hypothesis": "hypothesis", "_hypothesis_pytestplugin": "hypothesis",
    "_hypothesis_ftz_detector": "hypothesis", "_hypothesis_globals": "hypothesis",
    "sortedcontainers": "sortedcontainers", "attr": "attrs", "attrs": "attrs",
    "exceptiongroup": "exceptiongroup", "tomli": "tomli",  # only needed by Python < 3.11 (copied where present)
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
  mkdir -p "$DEST/.gpu_data/ml-1m"
  cp "$DATA/ml-1m/ratings.dat" "$DEST/.gpu_data/ml-1m/"
  echo "$DEST/.gpu_data/ml-1m: $(du -sh "$DEST/.gpu_data/ml-1m" | cut -f1)"
else
  echo "no \$DPREC_DATA/ml-1m/ratings.dat: gpu_check.sh will skip the ML-1M rows" >&2
fi
