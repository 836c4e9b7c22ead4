"""Markdown tables from experiments/results/ablation.jsonl (the rows experiments/meta_train_ablation.py appends).

Rows written before 2026-12-02 hold the comparison's old speedup (T over the step the learned optimizer reached tuned
Adam's final loss; ``reached``: on how many instances); later rows hold VeLO's speedup, the one of every metafam
table (``at_cap``: instances at 4x). The last column says which.

    python experiments/ablation_table.py [--file experiments/results/ablation.jsonl]
"""
import argparse
import json
import os


def main():
  p = argparse.ArgumentParser()
  p.add_argument("--file", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "results",
                                                "ablation.jsonl"))
  rows = [json.loads(line) for line in open(p.parse_args().file)]
  print("| run | trained on | evaluated on | theta | seed | meta-steps | wall s | learned final loss "
        "| tuned-Adam final loss | speedup [95% CI] | reached (old) / at 4x (new) |")
  print("|---|---|---|---|---|---|---|---|---|---|---|")
  for r in rows:
    theta = r["theta"] + (f" (step {r['best_step']})" if r.get("best_step") else "")
    fin = "nan" if r["final_loss"] is None else f"{r['final_loss']:.4f}"
    print(f"| {r['name']} | {r['trained_on']} | {r['family']} | {theta} | {r['seed']} | {r['meta_steps']} | "
          f"{r['train_seconds']:.0f} | {fin} | {r['adam_final_loss']:.4f} | {r['speedup']:.2f} "
          f"[{r['low']:.2f}, {r['high']:.2f}] | "
          + (f"{r['reached']}/16 reached |" if "reached" in r else f"{r['at_cap']}/16 at 4x |"))


if __name__ == "__main__":
  main()
