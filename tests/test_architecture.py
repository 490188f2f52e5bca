"""The layer rule of DESIGN.md, as a test: experiments/ never imports ray, mlflow or sqlalchemy."""

import subprocess
import sys

CODE = """
import sys
import experiments, experiments.core.runner, experiments.methods, experiments.models, experiments.interventions.heads
bad = sorted(m for m in ("ray", "mlflow", "sqlalchemy") if m in sys.modules)
print(",".join(bad))
"""


def test_experiments_imports_no_orchestration_library():
    out = subprocess.run([sys.executable, "-c", CODE], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""


ANALYSIS = """
import sys
import analysis.cli, analysis.figure_plan, analysis.loading, analysis.queries, analysis.select
import analysis.service, analysis.stats
bad = sorted(m for m in ("torch", "mlflow", "experiments.methods", "experiments.core.runner", "experiments.models")
             if m in sys.modules)
print(",".join(bad))
"""


def test_analysis_imports_no_training_code_and_no_mlflow():
    """analysis reads the registry and draws; training code and MLflow writes are the others' layers."""
    out = subprocess.run([sys.executable, "-c", ANALYSIS], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""
