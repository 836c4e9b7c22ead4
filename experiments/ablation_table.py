"""Markdown tables from experiments/results/ablation.jsonl (the rows experiments/meta_train_ablation.py appends).

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
        "| tuned-Adam final loss | speedup [95% CI] | reached |")
  print("|---|---|---|---|---|---|---|---|---|---|---|")
  for r in rows:
    theta = r["theta"] + (f" (step {r['best_step']})" if r.get("best_step") else "")
    fin = "nan" if r["final_loss"] is None else f"{r['final_loss']:.4f}"
    print(f"| {r['name']} | {r['trained_on']} | {r['family']} | {theta} | {r['seed']} | {r['meta_steps']} | "
          f"{r['train_seconds']:.0f} | {fin} | {r['adam_final_loss']:.4f} | {r['speedup']:.2f} "
          f"[{r['low']:.2f}, {r['high']:.2f}] | {r['reached']}/16 |")


if __name__ == "__main__":
  main()
