#!/usr/bin/env bash
# Pipeline parallel on CUDA: kiln verify --device cuda with --pp, the hidden
# states passed between the stages by NCCL's send/recv on the device, in
# KILN_CUDA_MATMUL=bf16x2 mode (fp32-grade products) within
# KILN_CUDA_TOL_X2 (default 1e-3, the CPU's tolerance) of the reference and
# within 1e-4 of the same ranks without --pp, page sizes 1 and 16, chunk 3
# (its mixed steps go in micro-batches).
#
#   verify_pp.sh      two GPUs (ctest cuda_verify_pp, label gpu_multi):
#                     --pp 2 on the dense, MoE and MLA oracle models
#   verify_pp.sh 4    four GPUs (ctest cuda_verify_pp_tp, label gpu_four):
#                     --pp 2 --tp 2 (--ep 2 on the MoE and MLA models), each
#                     stage's collectives on an NCCL communicator of its two
#                     ranks, the sends between the stages on the job's
#
# Fails, saying so, on a machine with fewer GPUs than the case needs.
set -u
: "${KILN:?}" "${KILN_FIXTURES:?}"
export NCCL_NVLS_ENABLE=${NCCL_NVLS_ENABLE:-0}
export KILN_CUDA_MATMUL=bf16x2
tol=${KILN_CUDA_TOL_X2:-1e-3}
gpus=${1:-2}
VERIFY_DEVICE=cuda
source "$KILN_SRC/tests/cli/lib/verify.sh"
need_gpus "$gpus"
# verify ARGS...: one run at chunk 3 within $tol, its max_abs_err in $err;
# status 1 (the failure printed) when it failed
verify() {
  kiln_verify --tolerance "$tol" --chunk 3 "$@" && return 0
  echo "FAIL: kiln verify --device cuda $*"; printf '%s\n' "$out" | tail -20
  return 1
}
# check ARCH PAGE "BASE" ARGS...: ARGS (with --pp) against the reference and
# against BASE (the same ranks without --pp; "" one GPU)
check() {
  local arch=$1 ps=$2 base=$3; shift 3
  local dir="$KILN_FIXTURES/oracle/tiny-models/$arch" want
  local model=(--model "$dir" --reference "$dir/reference.safetensors" --page-size "$ps")
  runs=$((runs + 1))
  # shellcheck disable=SC2086
  verify "${model[@]}" $base || { fail=$((fail + 1)); return; }
  want=$err
  verify "${model[@]}" "$@" || { fail=$((fail + 1)); return; }
  if awk -v a="$want" -v b="$err" 'BEGIN { d = a - b; exit !(d <= 1e-4 && d >= -1e-4) }'; then
    echo "ok: $arch $* --page-size $ps -> max_abs_err $err (${base:-one GPU}: $want)"
  else
    echo "FAIL: $arch $* --page-size $ps: max_abs_err $err, ${base:-one GPU} $want"; fail=$((fail + 1))
  fi
}
for ps in 1 16; do
  if [ "$gpus" -ge 4 ]; then
    for arch in llama qwen3; do check $arch $ps "--tp 2" --pp 2 --tp 2; done
    check qwen3_moe $ps "--tp 2 --ep 2" --pp 2 --tp 2 --ep 2
    check deepseek_v2 $ps "--tp 2 --ep 2" --pp 2 --tp 2 --ep 2
  else
    for arch in llama qwen3 qwen3_moe deepseek_v3; do check $arch $ps "" --pp 2; done
  fi
done
verify_done
