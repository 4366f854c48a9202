#!/usr/bin/env bash
# Run the test suite under CPU kernel sets other than this machine's own: floats of a trained model
# differ between CPUs (AVX2, AVX-512, AMX; MKL, oneDNN and CTranslate2 choose code paths by CPU), and
# no test may depend on them. Each set is one pytest run; the script fails if any set failed.
#   bash scripts/test_kernels.sh [PYTEST OPTIONS]     (make test-kernels PYTEST_ARGS=...)
# A set can only take the kernels of a CPU this one can run (an older ISA, fewer threads): an AVX2
# machine cannot show what AVX-512 computes. The ISA names are x86-64's; elsewhere only the last set
# changes anything.
set -euo pipefail
VPY=${VPY:-.venv/bin/python}
failed=()
sets=(
  "avx2|ATEN_CPU_CAPABILITY=avx2 MKL_CBWR=AVX2 ONEDNN_MAX_CPU_ISA=AVX2 CT2_FORCE_CPU_ISA=AVX2"
  "generic|ATEN_CPU_CAPABILITY=default MKL_CBWR=COMPATIBLE ONEDNN_MAX_CPU_ISA=SSE41 CT2_FORCE_CPU_ISA=GENERIC"
  "one-thread|OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 ONE_CORE=1"
)
for entry in "${sets[@]}"; do
  name=${entry%%|*}
  vars=${entry#*|}
  echo "== kernel set $name: $vars"
  prefix=()
  if [[ $vars == *ONE_CORE=1* ]]; then
    prefix=(taskset -c 0)  # one core: the project's own thread choice (the cores it may use) gives 1
  fi
  start=$(date +%s)
  # shellcheck disable=SC2086
  if env $vars ${prefix[@]+"${prefix[@]}"} "$VPY" -m pytest -p no:cacheprovider "$@"; then
    echo "== kernel set $name passed in $(($(date +%s) - start)) s"
  else
    echo "== kernel set $name FAILED in $(($(date +%s) - start)) s"
    failed+=("$name")
  fi
done
if [ ${#failed[@]} -gt 0 ]; then
  echo "== failed kernel sets: ${failed[*]}"
  exit 1
fi
