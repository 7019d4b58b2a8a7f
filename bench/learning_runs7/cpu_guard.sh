# Sourced by an execution's runner (bench/learning_runs8/run.sh, bench/learning_runs9/run.sh) with EXECUTION set,
# from the repository's root. The SFT weights follow the CPU's float path, so every job of one execution runs on one
# CPU model: the one its first finished SFT row was made on (E8's amendment A1), either of this workplace's two.
# bench/learning_runs<N>/cpu.txt names it from then on (bench/learning_runs7/run.sh writes it with that row); any other
# CPU is refused at once rather than training models that belong to no registered run. Sets `here` and `PINNED`.
CPUINFO=${CPUINFO:-/proc/cpuinfo}                       # read from elsewhere only by its test
PINNED=${PINNED:-bench/learning_runs$EXECUTION/cpu.txt}  # likewise
vendor=$(grep -m1 '^vendor_id' "$CPUINFO" | awk '{print $NF}'); model=$(grep -m1 -E '^model\s' "$CPUINFO" | awk '{print $NF}')
here="$vendor model $model"
case "$here" in
  "GenuineIntel model 167" | "AuthenticAMD model 17") ;;
  *) echo "run.sh: execution $EXECUTION runs on the Intel Xeon model 167 or the AMD EPYC model 17" \
          "(docs/experiments/E$EXECUTION-ablation-execution-$EXECUTION.md); this CPU is $here" >&2
     exit 2 ;;
esac
if [ -f "$PINNED" ] && [ "$(cat "$PINNED")" != "$here" ]; then
  echo "run.sh: execution $EXECUTION's models were made on $(cat "$PINNED") ($PINNED); this CPU is $here" >&2
  exit 2
fi
