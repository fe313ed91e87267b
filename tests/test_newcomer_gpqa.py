"""GPQA Diamond read in the hub schema has a per-subject breakdown (issue: tried as a new user
would, point 5): the official export's ``High-level domain`` column was not mapped. A completion
restating a choice whose text starts like a letter ("A = ..., B = ...") scores that choice (issue 66,
point 2)."""

from __future__ import annotations

import json

from r1kit.cli import main
from r1kit.evaluation import choices
from r1kit.evaluation.benchmarks import load_benchmark


def test_the_hub_schemas_high_level_domain_is_the_breakdown(tmp_path):
    rows = [{"Record ID": f"r{i}", "Question": f"Q{i}?", "Correct Answer": "yes", "Incorrect Answer 1": "no", "Incorrect Answer 2": "maybe",
             "Incorrect Answer 3": "never", "High-level domain": domain, "Subdomain": f"Some {domain}"}
            for i, domain in enumerate(["Physics", "Chemistry", "Physics"])]
    copy = tmp_path / "gpqa.jsonl"
    copy.write_text("".join(json.dumps(r) + "\n" for r in rows))
    bench = load_benchmark("gpqa_diamond", data_file=str(copy))
    gen = tmp_path / "gen.jsonl"
    gen.write_text("".join(json.dumps({"id": p.id, "completion": f"Answer: {p.answer}"}) + "\n" for p in bench.problems))
    assert main(["eval", "--benchmark", "gpqa_diamond", "--data-file", str(copy), "--completions", str(gen), "--output", str(tmp_path / "e")]) == 0
    breakdown = json.loads((tmp_path / "e" / "summary.json").read_text())["breakdown"]
    assert breakdown["subject"] == {"Chemistry": {"problems": 1, "pass@1": 1.0}, "Physics": {"problems": 2, "pass@1": 1.0}}


def test_the_printed_table_shows_the_breakdown(tmp_path, capsys):
    test_the_hub_schemas_high_level_domain_is_the_breakdown(tmp_path)
    assert "gpqa_diamond: pass@1 by subject (problems): Chemistry 100.0 (1), Physics 100.0 (2)" in capsys.readouterr().out


# Issue 66, point 2: GPQA choices whose own text starts like a letter ("A = ..., B = ...") were
# read as that letter when a completion restated them. Literal rows in the official export's shape.
LETTERED = [
    {"Record ID": "recA1", "Question": "Which pair of products forms in reactions A and B?", "High-level domain": "Chemistry",
     "Correct Answer": "A = benzoquinone, B = methyl 2-hydroxypropanoate",
     "Incorrect Answer 1": "A = cyclohexane-1,3-dione, B = methyl 2-hydroxypropanoate",
     "Incorrect Answer 2": "A = benzoquinone, B = dimethyl fumarate",
     "Incorrect Answer 3": "A = cyclohexane-1,3-dione, B = dimethyl fumarate"},
    {"Record ID": "recA2", "Question": "Which reagents, A and B, complete the scheme?", "High-level domain": "Chemistry",
     "Correct Answer": "A = NaHSO3, B = HCl", "Incorrect Answer 1": "A = H3O+, B = HCl",
     "Incorrect Answer 2": "A = NaHSO3, B = CH3COOH", "Incorrect Answer 3": "A = H3O+, B = CH3COOH"},
    {"Record ID": "recA3", "Question": "How does the rate change?", "High-level domain": "Physics",
     "Correct Answer": "A 2-fold increase", "Incorrect Answer 1": "A 4-fold increase",
     "Incorrect Answer 2": "B is unchanged", "Incorrect Answer 3": "C halves"},
    # Multi-line choices (reagent lists), a formula whose braces nest, and choices that are the question's items.
    {"Record ID": "recA5", "Question": "Which sequence of reagents gives the product?", "High-level domain": "Chemistry",
     "Correct Answer": "1. NaNH2, methyl chloride\n2. H2/Pd-calcium carbonate\n3. O3/ (CH3)2S\n4. Ba(OH)2",
     "Incorrect Answer 1": "1. NaNH2, methyl chloride\n2. H2/Pd\n3. O3/ (CH3)2S\n4. Ba(OH)2",
     "Incorrect Answer 2": "1. NaNH2, methanol\n2. Li/liq. NH3\n3. O3/ (CH3)2S\n4. NH4OH",
     "Incorrect Answer 3": "1. NaNH2, ethyl chloride\n2. Li/liq. NH3\n3. O3/ H2O\n4. NH4OH"},
    {"Record ID": "recA6", "Question": "Which potentials does the moving charge produce?", "High-level domain": "Physics",
     "Correct Answer": "V(\\vec{r},t) = \\dfrac{qc}{4\\pi\\epsilon_o (d c - \\vec{d}. \\vec{v})}",
     "Incorrect Answer 1": "V(\\vec{r},t) = \\dfrac{q}{4\\pi\\epsilon_o r}",
     "Incorrect Answer 2": "V(\\vec{r},t) = \\dfrac{q}{4\\pi\\epsilon_o d}",
     "Incorrect Answer 3": "V(\\vec{r},t) = \\dfrac{qc}{4\\pi\\epsilon_o (d c + \\vec{d}. \\vec{v})}"},
    {"Record ID": "recA7", "Question": "Which of the planets a) to d) is densest?", "High-level domain": "Physics",
     "Correct Answer": "c", "Incorrect Answer 1": "a", "Incorrect Answer 2": "b", "Incorrect Answer 3": "d"},
    # Two choices that differ only in case (as one official row does), and a duplicate distractor.
    {"Record ID": "recA4", "Question": "Which notation is right?", "High-level domain": "Physics",
     "Correct Answer": "kT", "Incorrect Answer 1": "KT", "Incorrect Answer 2": "2kT", "Incorrect Answer 3": "2kT"},
]
FORMS = ["<think>...</think>\nAnswer: {text}", "<think>...</think>\nThe answer is {text}.", "\\boxed{{{text}}}", "<think>...</think>\n{text}"]


def restated_pass_at_1(tmp_path, wrong: bool) -> float:
    """pass@1 of completions that restate, in each of FORMS, the correct choice's text (or, with
    `wrong`, each wrong choice's), scored as ``r1kit eval --completions`` scores them."""
    from r1kit.evaluation.evaluate import score_completions

    copy = tmp_path / "gpqa.jsonl"
    copy.write_text("".join(json.dumps(r) + "\n" for r in LETTERED))
    bench = load_benchmark("gpqa_diamond", data_file=str(copy))
    rows = []
    for p in bench.problems:
        gold = choices.LETTERS.index(p.answer)
        texts = [c for i, c in enumerate(p.choices) if (i != gold) == wrong]
        rows += [{"id": p.id, "completion": form.format(text=text)} for text in texts for form in FORMS]
    gen = tmp_path / "gen.jsonl"
    gen.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return score_completions(bench, gen, tmp_path / "eval")["pass@1"]


def test_restating_the_correct_choices_text_scores_correct(tmp_path):
    assert restated_pass_at_1(tmp_path, wrong=False) == 1.0


def test_restating_a_wrong_choices_text_scores_wrong(tmp_path):
    assert restated_pass_at_1(tmp_path, wrong=True) == 0.0


def test_a_letter_before_a_lettered_choice_still_reads_the_letter():
    row = LETTERED[0]
    shown = [row["Incorrect Answer 1"], row["Incorrect Answer 2"], row["Correct Answer"], row["Incorrect Answer 3"]]
    assert choices.answer_letter(f"Answer: C) {shown[2]}", shown) == "C"
    assert choices.answer_letter(f"(C) {shown[2]}", shown) == "C"
    assert choices.answer_letter("**Answer:** C", shown) == "C"
