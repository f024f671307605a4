#!/usr/bin/env bash
# kiln serve --device cuda --tp 2 --deterministic on two GPUs (label
# gpu_multi): a request alone and among 31 others gives the same tokens,
# greedy and sampled (/generate, stories260K); and the same server with
# NCCL alone (KILN_CUDA_ONE_SHOT=0) gives the same tokens as the default
# one, whose all-reduces of a decode step run as the one-shot kernel over
# CUDA IPC fused with the residual add + RMSNorm (its log says so): with
# two ranks both add the same two parts and the fused norm keeps
# add_rmsnorm's arithmetic, so the steps are the same bits. Fails, saying
# so, with fewer than two GPUs. NCCL_NVLS_ENABLE=0 unless set.
set -u
SERVE_NODE=0 source "$KILN_SRC/tests/server/serve.sh"
export NCCL_NVLS_ENABLE=${NCCL_NVLS_ENABLE:-0}
n_gpu=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')
if [ "${n_gpu:-0}" -lt 2 ]; then
  echo "FAIL: this test needs two or more GPUs (found ${n_gpu:-0}): run it with ctest -L gpu_multi on such a machine"
  exit 1
fi
M="$KILN_MODELS/stories260K"
serve_start D --model "$M" --device cuda --tp 2 --deterministic --skip-sampler-warmup
KILN_CUDA_ONE_SHOT=0 serve_start E --model "$M" --device cuda --tp 2 --deterministic --skip-sampler-warmup
grep -q "one kernel over CUDA IPC" "$LOG_D" ||
  { echo "FAIL: the default server does not use the one-shot all-reduce"; tail -20 "$LOG_D"; exit 1; }
grep -q "one kernel over CUDA IPC" "$LOG_E" &&
  { echo "FAIL: KILN_CUDA_ONE_SHOT=0 still uses the one-shot all-reduce"; exit 1; }
python3 - "$URL_D" "$URL_E" <<'PY' || exit 1
import json, sys, urllib.request
from concurrent.futures import ThreadPoolExecutor
url_d, url_e = sys.argv[1], sys.argv[2]
names = ['Lily', 'Tom', 'Sue', 'Max', 'Ben', 'Anna', 'Tim', 'Mia']
things = ['a red ball', 'a big tree', 'a small cat', 'the sea', 'a toy car', 'a cake', 'the moon', 'a dog']
def prompt(i):
    return f"Once upon a time, {names[i % 8]} saw {things[(i * 5 + 3) % 8]}. {names[(i + 3) % 8]} said"
def ids(url, i, sampled):
    body = {"text": prompt(i), "sampling_params": {"max_new_tokens": 24, "temperature": 0.9 if sampled else 0,
            "seed": 1000 + i, "ignore_eos": True}}
    req = urllib.request.Request(url + "/generate", json.dumps(body).encode(), {"Content-Type": "application/json"})
    out = json.load(urllib.request.urlopen(req, timeout=120))["output_ids"]
    assert len(out) == 24, out
    return out
fail = 0
for sampled in (False, True):
    kind = "sampled" if sampled else "greedy"
    alone = ids(url_d, 0, sampled)
    with ThreadPoolExecutor(32) as ex:
        batch = list(ex.map(lambda i: ids(url_d, i, sampled), range(32)))
    if batch[0] != alone:
        print(f"FAIL: --tp 2 --deterministic ({kind}): alone {alone}, among 31 others {batch[0]}"); fail = 1
    else:
        print(f"ok: --tp 2 --deterministic ({kind}): alone = among 31 others")
    nccl = ids(url_e, 0, sampled)
    if nccl != alone:
        print(f"FAIL: ({kind}) the fused one-shot all-reduce gives {alone}, NCCL alone {nccl}"); fail = 1
    else:
        print(f"ok: ({kind}) the fused one-shot all-reduce = NCCL alone")
sys.exit(fail)
PY
for s in D E; do serve_stop "$s" || exit 1; done
echo "serve_multi: ok"
