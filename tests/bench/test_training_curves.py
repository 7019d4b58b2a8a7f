"""bench/training_curves.py: first/last-window means per run from each run's metrics.jsonl, then mean ± SE
per arm; steps without a metric are skipped; no runs is an error."""
import json

import pytest

from support.paths import load_script


@pytest.fixture(scope="module")
def curves():
    return load_script("bench/training_curves.py")


def _write(path, rows):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def test_windows_arms_and_output(curves, tmp_path, capsys):
    out = tmp_path / "ablation"
    for seed, offset in ((0, 0.0), (1, 1.0)):
        _write(out / "grpo" / f"seed{seed}" / "metrics.jsonl",
               [{"step": s, "rollout/turns": float(s) + offset, "reward/format_rate": 1.0,
                 **({"memory/keeps_facts": 0.5} if s != 4 else {})} for s in range(1, 7)])
    _write(out / "mempo_x" / "seed0" / "metrics.jsonl", [{"step": 1, "rollout/turns": 3.0}])
    runs = curves.collect(out, window=2)
    assert set(runs) == {"grpo_s0", "grpo_s1", "mempo_x_s0"}
    assert runs["grpo_s0"]["turns_first"] == 1.5 and runs["grpo_s0"]["turns_last"] == 5.5
    assert runs["grpo_s1"]["turns_last"] == 6.5 and runs["grpo_s0"]["keeps_last"] == 0.5
    assert runs["mempo_x_s0"]["keeps_first"] is None and runs["mempo_x_s0"]["turns_first"] == 3.0
    table = curves.markdown(runs, 2)
    assert "| grpo | 2 | 2.000 ± 0.500 | 6.000 ± 0.500 |" in table  # (1.5, 2.5) and (5.5, 6.5) over two seeds
    assert "| mempo_x | 1 | 3.000 | 3.000 | - | - | - | - |" in table
    target = tmp_path / "curves.json"
    assert curves.main(["--out", str(out), "--window", "2", "--json", str(target)]) == 0
    assert json.loads(target.read_text()) == runs and "| grpo |" in capsys.readouterr().out
    assert curves.main(["--out", str(tmp_path / "empty")]) == 2
    with pytest.raises(SystemExit):
        curves.main(["--out", str(out), "--window", "0"])
