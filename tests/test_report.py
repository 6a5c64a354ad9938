"""`python -m eagle3lab.pipeline.report --compare`: another run's headline figures beside the reference run's."""

import json
import shutil

from eagle3lab import paths
from eagle3lab.pipeline import report


def test_compare_sets_each_figure_beside_the_reference(tmp_path, capsys):
    reference, other = tmp_path / "reference", tmp_path / "other"
    shutil.copytree(paths.METRICS, reference)
    shutil.copytree(paths.METRICS, other)
    regen = json.loads((other / "regen.json").read_text())
    regen["tokens_per_s"] *= 2
    (other / "regen.json").write_text(json.dumps(regen))
    (other / "scaling.json").unlink()  # a run that stopped before its last stage

    rows = {
        line.split(" | ")[0].strip("| "): line.split(" | ") for line in report.compare(reference, other).splitlines()
    }
    assert rows["regen tok/s"][1] == "speed" and rows["regen tok/s"][-1].strip(" |") == "2.000"
    assert rows["regen success"][-1].strip(" |") == "1.000"
    assert rows["scaling break-even accept length"][3] == "-"  # missing in the other run, shown as such
    assert any(name.startswith("benchmark ") and kind == "quality" for name, kind, _ in report.headline(reference))

    assert report.main(["--compare", str(reference), str(other)]) == 0
    assert "regen tok/s" in capsys.readouterr().out
