#!/usr/bin/env bash
# Execution 7 (issue 44; protocol: docs/experiments/E7-ablation-execution-7.md, committed before any run): the k <= 8
# recipe (configs/demo_k8.yaml), three SFT models gated on the validation split, the memory-reward definition chosen
# there, then GRPO and MemPO (that definition) RL on k = 4 and 8 in turn, 36 steps, seeds 0-7 paired per model,
# evaluated at k = 2, 4 and 8 on the 128 test episodes per k; the rules in between are bench/learning_runs7/ex7.py's.
#
#     bash bench/learning_runs7/run.sh          # then: python bench/learning_runs7/ex7.py summary
#
# Executions 8-10 (docs/experiments/E8-*.md to E10-*.md) run this script with their own recipes and folders
# (bench/learning_runs<N>/run.sh sets EXECUTION=<N> and CONFIG, after cpu_guard.sh); the rules are the same ex7.py's.
#
# Everything finished is kept in bench/learning_runs7/ (under git): the SFT rows (sft_s<seed>.jsonl), the signal
# results (signal_s<seed>/), best.txt and signal.json, each RL run (m<seed>/<arm>_s<s>.json, metrics/), so a rerun
# (on this machine or a fresh one of the same CPU model) continues where it stopped; the SFT models and rollouts
# live in scratch/ex7/ (remade from the kept rows' seeds when missing, their weights' digests checked). Two jobs of
# one torch thread at a time (2 cores). Stopping this script (Ctrl-C, or kill $(cat scratch/ex<N>/run.pid)) stops
# every job it started.
set -euo pipefail
cd "$(dirname "$0")/../.."
export PYTHONPATH=.
PY=${PY:-.venv-test/bin/python}
EXECUTION=${EXECUTION:-7}
R=${RUNS_DIR:-bench/learning_runs$EXECUTION}  # elsewhere only in its test
S=${SCRATCH_DIR:-scratch/ex$EXECUTION}        # likewise
CONFIG=${CONFIG:-configs/demo_k8.yaml}
RULES="$PY bench/learning_runs7/ex7.py"
MODELS=$S/models
DEFINITIONS=(paper paper_nothresh retrieved_min_c10 complete_min_c10 all_fixes_min_c10)  # ex7.CANDIDATES
mkdir -p $S
# The tree's mempo (PYTHONPATH=.) needs its C++ scanner built in place; without it every job would fail only at its
# first evaluation, after half an hour of SFT.
$PY -c "import mempo._scanner" 2>/dev/null || {
  echo "run.sh: mempo._scanner is not built in this tree: run \`$PY setup.py build_ext --inplace\` first" >&2; exit 2; }
# No job outlives the script: a job is a subshell running python, and a killed subshell leaves its python running,
# so each job's whole process tree is listed first, then killed.
# ($(jobs -p) is read before the pipe: inside one it lists no jobs)
tree() { echo "$1"; local child; for child in $(pgrep -P "$1"); do tree "$child"; done; }
stop_jobs() { local pids pid; pids=$(jobs -p); for pid in $pids; do tree "$pid"; done | xargs -r kill 2>/dev/null || true; }
trap stop_jobs EXIT
trap 'exit 143' INT TERM  # exit runs the EXIT trap; no job starts after it
echo $$ > $S/run.pid  # stop it with: kill $(cat $S/run.pid) (pkill -f would also hit the jobs' subshells first)

{ echo "--- $(date -Is) $(git rev-parse --short HEAD)"; lscpu | grep -E "^Model name|^CPU\(s\)";
  grep -m1 -E "^model\s" /proc/cpuinfo; uptime; } >> $R/machine.txt  # the machine, named at run time

tag() { echo "$(basename "$CONFIG" .yaml)_eval.split-validation_s$1"; }  # tools/sft_seeds.py's model folder of seed $1

two_at_a_time() {  # two_at_a_time FUNCTION ARG...: FUNCTION ARG for each ARG, two at a time; a failure stops all
  local f=$1; shift
  while [ $# -gt 0 ]; do
    local pids=()
    $f "$1" & pids+=($!); shift
    if [ $# -gt 0 ]; then $f "$1" & pids+=($!); shift; fi
    for pid in "${pids[@]}"; do wait "$pid"; done
  done
}

sft() {  # SFT seed $1: its row (greedy EM at k = 2, 4, 8 on validation) in $R, its model in $MODELS
  local s=$1 args
  args=(--config $CONFIG --seeds "$s" --threads 1 --ks 2 4 8 --models-dir $MODELS --episodes-dir $S/sft_episodes
        eval.split=validation)
  if [ -f $R/sft_s$s.jsonl ] && [ -d $MODELS/$(tag "$s")/model_sft ]; then return; fi
  if [ -f $R/sft_s$s.jsonl ]; then  # the row is kept, the model is not (a fresh machine): remake it, same digest
    rm -f $S/remake_s$s.jsonl
    $PY tools/sft_seeds.py "${args[@]}" --out $S/remake_s$s.jsonl > $S/sft_s$s.log 2>&1
    $RULES same-weights $R/sft_s$s.jsonl $S/remake_s$s.jsonl
  else
    $PY tools/sft_seeds.py "${args[@]}" --out $S/sft_s$s.jsonl > $S/sft_s$s.log 2>&1
    mv $S/sft_s$s.jsonl $R/sft_s$s.jsonl  # whole, once finished
    # the CPU of the first finished row is the execution's from then on (cpu_guard.sh reads it back)
    if [ -n "${CPU_PIN:-}" ] && [ ! -f "$CPU_PIN_FILE" ]; then echo "$CPU_PIN" > "$CPU_PIN_FILE"; fi
  fi
}

signal() {  # the signal benchmark of model $1 on the validation split: 32 episodes x 8 samples at k = 4 and 8
  local s=$1
  if [ -f $R/signal_s$s/results.json ]; then return; fi
  $PY bench/bench_signal.py --demo-out $MODELS/$(tag "$s") --out $S/signal_s$s --questions 32 --samples 8 --ks 4 8 \
      --definitions "${DEFINITIONS[@]}" --threads 1 eval.split=validation > $S/signal_s$s.log 2>&1
  mkdir -p $R/signal_s$s
  cp $S/signal_s$s/results.md $R/signal_s$s/
  cp $S/signal_s$s/results.json $R/signal_s$s/  # last: its presence says the benchmark finished
}

rl() {  # rl MODEL SEED...: GRPO and MemPO of each seed, one seed after the other, on the test split
  local m=$1 seed; shift
  for seed in "$@"; do
    # each finished run's file and metrics (m<m>/metrics/<arm>_s<s>.jsonl) are kept by bench_learning as it ends
    $PY bench/bench_learning.py --demo-out $MODELS/$(tag "$m") --runs $R/m$m --out $S/rl_m${m}_s$seed \
        --variants grpo --best "$BEST" --steps 36 --episodes 128 --ks 2 4 8 --threads 1 --seeds "$seed" eval.split=test
  done
}

# 1. SFT seeds 0-5 in order, two at a time, until the three lowest passing seeds are known (the gate)
while next=$($RULES next $R) && [ -n "$next" ]; do
  # shellcheck disable=SC2086
  two_at_a_time sft $next
done
status=0
models=$($RULES models $R) || status=$?
if [ $status -eq 3 ]; then
  echo "fewer than 3 SFT models passed the gate: execution $EXECUTION is not a test (docs/experiments/E$EXECUTION-*.md)"
  $RULES summary $R  # the gate's table (results.md) and plot (gate_e$EXECUTION.png)
  exit 0
fi
[ $status -eq 0 ] || exit $status
# A kept row whose model left the machine (a fresh one) is remade, and checked, only where a step still needs the
# model: a session remakes the models of the work left, not all three.

# 2. the signal benchmark of each gated model on validation, then the definition and the signal check
sft_signal() { if [ ! -f $R/signal_s$1/results.json ]; then sft "$1"; signal "$1"; fi; }
# shellcheck disable=SC2086
two_at_a_time sft_signal $models
BEST=$($RULES choose $R)
echo "definition chosen on validation: $BEST"

# 3. RL, model by model, skipping finished models (results.json kept); the first two unfinished ones remade together.
# Two workers per model (seeds 0-3, 4-7), the second once the SFT model's evaluation is written
todo=()
for m in $models; do if [ ! -f $R/m$m/results.json ]; then todo+=("$m"); fi; done
two_at_a_time sft "${todo[@]:0:2}"
for m in "${todo[@]}"; do
  sft "$m"
  rl "$m" 0 1 2 3 > $S/rl_m${m}_w0.log 2>&1 &
  w0=$!
  while [ ! -f $R/m$m/sft.json ] && kill -0 $w0 2>/dev/null; do sleep 10; done
  rl "$m" 4 5 6 7 > $S/rl_m${m}_w1.log 2>&1 &
  w1=$!
  wait $w0
  wait $w1
  $PY bench/bench_learning.py --demo-out $MODELS/$(tag "$m") --runs $R/m$m --out $S/rl_m$m --variants grpo \
      --best "$BEST" --steps 36 --episodes 128 --ks 2 4 8 --threads 1 eval.split=test > $S/rl_m$m.log 2>&1
  cp $S/rl_m$m/results.md $S/rl_m$m/results.json $R/m$m/
  if [ -f $S/rl_m$m/ablation.png ]; then cp $S/rl_m$m/ablation.png $R/m$m/; fi
done

# 4. the tables, the pooled estimate and the decision (results.md, ablation_e$EXECUTION.png)
$RULES summary $R
