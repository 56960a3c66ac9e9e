"""How well the zoo `chainarith` target's self-judge separates valid from invalid draft steps.

Run: `python benchmarks/chainarith_judge_check.py` (after `specmm zoo build chainarith --scale cpu`). Drafts 48
held-out problems greedily with the draft, scores every draft step with the target's expected judge digit
(the SpecReason score) and prints the mean score of valid and invalid steps and the share kept per threshold.
"""

import statistics

import torch

from specmm import zoo
from specmm.core.sampling import GREEDY
from specmm.reasoning import DraftOnly, JudgeTemplate, StepSpeculator
from specmm.zoo import chainarith
from specmm.zoo.chainarith_task import JUDGE, StepChecker


def main() -> None:
    torch.set_num_threads(1)
    models = chainarith.load(zoo.path("chainarith", "cpu"))
    tokenizer, problems = models.tokenizer, models.heldout_problems(48)
    spec = StepSpeculator(models.target, models.draft, tokenizer, DraftOnly(), delimiter=[models.step_token_id],
                          max_step_tokens=12)
    out = spec.generate([p.prompt for p in problems], max_new_tokens=96, sampling=GREEDY)
    checker, template = StepChecker(tokenizer), JudgeTemplate.from_text(tokenizer, JUDGE)
    scores = {True: [], False: []}
    with torch.no_grad():
        for b, problem in enumerate(problems):
            prompt, completion = tokenizer.encode(problem.prompt), out.completions[b]
            for start, end in out.step_spans[b]:
                context, step = prompt + completion[:start], completion[start:end]
                logits = models.target(torch.tensor([context + step + list(template.suffix_ids)])).logits[:, -1]
                valid = checker([context], [step])[0] == 1.0
                scores[valid].append(float(template.score(logits, "expected")[0]))
    print(f"valid steps {len(scores[True])}: mean score {statistics.mean(scores[True]):.2f}; "
          f"invalid steps {len(scores[False])}: mean score {statistics.mean(scores[False]):.2f}")
    for t in (3, 6, 8):
        kept = {v: sum(s >= t for s in scores[v]) / len(scores[v]) for v in (True, False)}
        print(f"threshold {t}: keeps {kept[True]:.2f} of valid and {kept[False]:.2f} of invalid steps")


if __name__ == "__main__":
    main()
