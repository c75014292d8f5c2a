#!/usr/bin/env bash
# Run the MAD sweeps of several models (or preset sweeps) side by side on one GPU for at most CAP seconds (a
# leased machine's per-command limit), then pack what finished so the next machine can go on from it.
#
#   CAP=540 PACK=/some/dir bash scripts/mad_chunks_gpu.sh \
#       "transformer|3|mad/memorization|2|cuda-graph;1|mad/compression|2|auto" "static_conv_qkv|1|mad/compression|2|auto"
#
# Each argument is one model: MODEL, then ';'-separated steps SEEDS|TASKS|WORKERS|SPEED, run one after another,
# each a `mixlab mad run --profile PROFILE` into WORK/<MODEL>-SUFFIX (seeded from FROM/<MODEL>-SUFFIX the first
# time). PROFILE: paper (default) or quick; SUFFIX: paper-v2 for paper, else PROFILE; FROM: reproductions/mad.
# TASKS '-': every task of the profile. For the baselines' quick table:
#   PROFILE=quick FROM=reproductions/baselines/mad CAP=560 bash scripts/mad_chunks_gpu.sh "gla|3|-|2|auto" ...
# An argument "sweep:PRESET|SEEDS|TASKS|WORKERS|SPEED" runs `mixlab sweep PRESET` into WORK/PRESET instead (seeded
# from FROM/PRESET), e.g. FROM=reproductions/baselines ... "sweep:baselines_mqar|3|-|8|auto".
# The commands share GPU 0 (NVIDIA MPS on where it can start, so their kernels overlap).
# Every command is stopped by SIGINT before CAP, which makes the sweep checkpoint its stacks in flight
# (runners/train/resume.py); WORK is reused while the machine lives, so the next call resumes them.
# STOP_AFTER (seconds, optional): no new stack starts after it (the last call of a lease: no stack is cut).
# PACK gets gpu_util.csv (nvidia-smi every 10 s), records.tgz (every finished record, the manifests and the
# logs) and partial.tgz.* (checkpoints, in 15 MiB pieces, at most PARTIAL_MB MiB together); on a fresh machine,
# pieces in RESTORE are unpacked into WORK first.
# WHEELS (default .gpu/wheels): wheels installed without dependencies first, for what the GPU image lacks (it has
# no network and no fla-core: `pip download fla-core==0.6.0 --no-deps -d .gpu/wheels` here, then carry
# .gpu/wheels and RESTORE; one carry of all of .gpu can pass the 64 MiB a call carries).
set -u
CAP=${CAP:-540}
PACK=${PACK:-${OUT:?set PACK to the folder that receives the results}}
WORK=${WORK:-/tmp/mad}
RESTORE=${RESTORE:-.gpu/state}
PROFILE=${PROFILE:-paper}
if [ "$PROFILE" = paper ]; then SUFFIX=${SUFFIX:-paper-v2}; else SUFFIX=${SUFFIX:-$PROFILE}; fi
FROM=${FROM:-reproductions/mad}
start=$(date +%s)
export PYTHONUNBUFFERED=1
mkdir -p "$WORK" "$PACK"
nvidia-cuda-mps-control -d 2>/dev/null && echo "MPS on"
for w in "${WHEELS:-.gpu/wheels}"/*.whl; do
  [ -f "$w" ] && python -m pip install -q --no-deps "$w" >/dev/null 2>&1 && echo "installed $(basename "$w")"
done
folder() {  # an argument's name -> its folder's name under WORK and FROM
  case "$1" in sweep:*) echo "${1#sweep:}" ;; *) echo "$1-$SUFFIX" ;; esac
}
seed_folder() {
  local f; f=$(folder "$1")
  [ -d "$WORK/$f" ] && return
  if [ -d "$FROM/$f" ]; then cp -r "$FROM/$f" "$WORK/"; else mkdir -p "$WORK/$f"; fi
}
if [ ! -f "$WORK/.restored" ] && ls "$RESTORE"/partial.tgz.* >/dev/null 2>&1; then
  for arg in "$@"; do seed_folder "${arg%%|*}"; done
  cat "$RESTORE"/partial.tgz.* | tar xz -C "$WORK" && echo "restored checkpoints from $RESTORE"
fi
touch "$WORK/.restored"
# After SIGINT the sweep gives its workers 60 s to checkpoint (runners/sweep/local_backend.py) before it kills them;
# timeout's SIGKILL comes 15 s after that, and 20 s are left to pack.
pids=()
left=$(( CAP - ($(date +%s) - start) - 95 ))
for arg in "$@"; do
  m=${arg%%|*}
  seed_folder "$m"
  (
    t0=$(date +%s)
    IFS=';' read -ra steps <<< "${arg#*|}"
    for s in "${steps[@]}"; do
      IFS='|' read -r seeds tasks workers speed <<< "$s"
      rem=$(( left - ($(date +%s) - t0) ))
      [ "$rem" -lt 20 ] && break
      stop=()
      if [ -n "${STOP_AFTER:-}" ]; then
        st=$(( STOP_AFTER - ($(date +%s) - t0) ))
        [ "$st" -le 0 ] && break
        stop=(--stop-after "$st")
      fi
      echo "=== $m seeds=$seeds tasks=$tasks workers=$workers speed=$speed cap=$rem $(date +%T)"
      only=()
      [ "$tasks" != "-" ] && only=(--tasks "$tasks")
      case "$m" in sweep:*) what=(sweep "${m#sweep:}") ;; *) what=(mad run --model "$m" --profile "$PROFILE") ;; esac
      timeout -s INT -k 75 "$rem" mixlab "${what[@]}" --seeds "$seeds" "${only[@]}" \
        --device cuda --workers "$workers" --cuda-devices 0 --max-stack 18 --speed "$speed" \
        --checkpoint-every 60 --out "$WORK/$(folder "$m")" --no-progress "${stop[@]}"
      echo "=== $m rc=$? $(date +%T)"
    done
  ) > "$WORK/${m#sweep:}.log" 2>&1 &
  pids+=($!)
done
# The GPU's busy share and memory every 10 s while the sweeps run: is the GPU saturated, or would more workers help?
nvidia-smi --query-gpu=timestamp,utilization.gpu,memory.used --format=csv,noheader,nounits -l 10 \
  > "$PACK/gpu_util.csv" 2>/dev/null &
smi=$!
wait "${pids[@]}"
kill "$smi" 2>/dev/null
awk -F', ' '{n++; u+=$2; if ($3 > m) m = $3} END {if (n) printf "GPU busy %.0f%% on average over %d samples, memory up to %d MiB\n", u / n, n, m}' \
  "$PACK/gpu_util.csv"
cd "$WORK" || exit 1
for arg in "$@"; do
  m=${arg%%|*}
  echo "== $m: $(find "$(folder "$m")/runs" -maxdepth 1 -name '*.json' 2>/dev/null | wc -l) record files"
  grep -v -E '^\||^cells|resource_tracker|warnings.warn' "${m#sweep:}.log" | tail -n 12
done
find . -maxdepth 3 \( -path './*/runs/*.json' -o -path './*/sweep.json' -o -name '*.log' \) -print0 \
  | tar czf "$PACK/records.tgz" --null -T -
# Checkpoints of stacks in flight, the most work saved first (steps x runs still training), as many as fit in
# PARTIAL_MB MiB and beside records.tgz in the 63 MiB a call brings back (a one-seed MAD stack's checkpoint is
# about 30 MiB, so two come back; the rest restart on the next machine).
python - "$PACK" "${PARTIAL_MB:-60}" <<'PY'
import json, pathlib, subprocess, sys
pack = pathlib.Path(sys.argv[1])
budget = min(float(sys.argv[2]) * 2**20, 63 * 2**20 - (pack / "records.tgz").stat().st_size)
found = []
for meta in pathlib.Path(".").glob("*/runs/partial/*.json"):
    info = json.loads(meta.read_text())
    pt = meta.parent / info.get("pt", meta.stem + ".pt")  # the .pt the .json names (runners/train/resume.py)
    if pt.exists():
        found.append((info["step"] * len(info["live"]), pt.stat().st_size, meta, pt))
chosen, used = [], 0
for work, size, meta, pt in sorted(found, key=lambda f: -f[0]):
    if used + size <= budget:
        chosen += [str(meta), str(pt)]
        used += size
print(f"checkpoints: {len(chosen) // 2} of {len(found)} packed ({used / 2**20:.0f} MB)")
if chosen:
    tar = subprocess.Popen(["tar", "cz", *chosen], stdout=subprocess.PIPE)
    subprocess.run(["split", "-b", "15M", "-", str(pack / "partial.tgz.")], stdin=tar.stdout, check=True)
    tar.wait()
PY
echo "total $(( $(date +%s) - start )) s"
