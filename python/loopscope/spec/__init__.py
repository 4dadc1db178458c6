"""Experiment files: models (:mod:`.models`), loading with located errors
(:mod:`.load`), the JSON Schema, and the plan a run follows (:mod:`.plan`)."""

from loopscope.spec.load import Problem, SpecError, load, parse
from loopscope.spec.models import Experiment, HasModels, experiment_model


def json_schema(kinds: HasModels) -> dict[str, object]:
    """The JSON Schema of experiment files with ``kinds``' probes (``loopscope schema``)."""
    s = experiment_model(kinds).model_json_schema(mode="validation")
    s["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    s["title"] = "loopscope experiment"
    # a monitor file needs no duration (its probes measure a period at a time)
    s["required"] = [r for r in s.get("required", []) if r != "duration"]
    s["if"] = {"not": {"required": ["monitor"]}}
    s["then"] = {"required": ["duration"]}
    return s


__all__ = ["Experiment", "HasModels", "Problem", "SpecError", "experiment_model", "json_schema", "load", "parse"]
