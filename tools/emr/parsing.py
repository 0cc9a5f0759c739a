"""EMR_SEARCH input: the validated arguments model and the reader for plain text a model wrote.

Codes and patient ids are normalised and validated here (``[A-Z0-9.]`` and ``P`` + digits), so
nothing but well-formed values ever reaches a query; they still travel only as bound parameters.
"""

from __future__ import annotations

import re
from typing import Any, Literal, Optional

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

__all__ = ["EMRInput", "parse_emr_text"]

# An ICD-10-CM code as the parser writes it. "[.]", not "\.": the pattern also goes into a grammar
# (written_input_schema), and llama.cpp's grammar reader refuses the "\." the converter makes of an escaped dot.
_ICD_CODE = re.compile(r"^[A-Z][0-9][0-9A-Z]([.][0-9A-Z]{1,4})?$")
_ICD_IN_TEXT = re.compile(r"\b([A-TV-Z][0-9][0-9AB](?:\.[0-9A-Z]{1,4})?)\b", re.IGNORECASE)
_PID_IN_TEXT = re.compile(r"\b(P\d{1,6})\b", re.IGNORECASE)
_OPERATIONS = {
    "similar": "similar", "similar_patients": "similar", "similarpatients": "similar", "search": "similar",
    "cohort": "similar", "find": "similar", "match": "similar",
    "lookup": "lookup", "look_up": "lookup", "record": "lookup", "get": "lookup", "get_record": "lookup",
    "patient": "lookup", "fetch": "lookup", "read": "lookup",
}


def _normalise_code(code: str) -> str:
    code = str(code).strip().strip(".,;").upper().replace(" ", "")
    if len(code) > 3 and "." not in code:
        code = f"{code[:3]}.{code[3:]}"
    if not _ICD_CODE.match(code):
        raise ValueError(f"{code!r} is not an ICD-10-CM code (e.g. E11.9 or I50)")
    return code


def _normalise_pid(value: str) -> str:
    value = str(value).strip().upper()
    if value.isdigit():
        value = f"P{int(value):05d}"
    match = re.fullmatch(r"P(\d{1,6})", value)
    if not match:
        raise ValueError(f"{value!r} is not a patient id (e.g. P00042)")
    return f"P{int(match.group(1)):05d}"


class EMRInput(BaseModel):
    """Arguments of EMR_SEARCH. ``operation`` is inferred when omitted (patient_id -> lookup)."""

    model_config = ConfigDict(extra="forbid")

    operation: Optional[Literal["similar", "lookup"]] = Field(default=None, description="'similar' or 'lookup'.")
    codes: list[str] = Field(default_factory=list, max_length=10, description="ICD-10-CM codes, e.g. ['E11.9'].")
    condition: Optional[str] = Field(default=None, max_length=200, description="Words of a diagnosis, e.g. 'heart failure'.")
    sex: Optional[Literal["F", "M"]] = None
    age_min: Optional[int] = Field(default=None, ge=0, le=120)
    age_max: Optional[int] = Field(default=None, ge=0, le=120)
    patient_id: Optional[str] = Field(default=None, description="For lookup, e.g. 'P00042'.")
    limit: int = Field(default=3, ge=1, le=20, description="Case groups to show (similar).")

    @field_validator("operation", mode="before")
    @classmethod
    def _operation(cls, value: Any) -> Any:
        if isinstance(value, str):
            key = re.sub(r"[\s-]+", "_", value.strip().lower())
            if key not in _OPERATIONS:
                raise ValueError("operation must be 'similar' or 'lookup'")
            return _OPERATIONS[key]
        return value

    @field_validator("codes", mode="before")
    @classmethod
    def _codes(cls, value: Any) -> Any:
        if value is None:
            return []
        if isinstance(value, str):
            value = [v for v in re.split(r"[,;\s]+", value) if v]
        if not isinstance(value, (list, tuple)):
            raise ValueError("codes must be a list of ICD-10-CM codes")
        return list(dict.fromkeys(_normalise_code(v) for v in value))

    @field_validator("sex", mode="before")
    @classmethod
    def _sex(cls, value: Any) -> Any:
        if isinstance(value, str):
            v = value.strip().lower()
            if v in ("f", "female", "woman", "women"):
                return "F"
            if v in ("m", "male", "man", "men"):
                return "M"
            if v in ("", "any", "all", "either"):
                return None
        return value

    @field_validator("patient_id", mode="before")
    @classmethod
    def _pid(cls, value: Any) -> Any:
        return None if value in (None, "") else _normalise_pid(value)

    @field_validator("condition", mode="before")
    @classmethod
    def _condition(cls, value: Any) -> Any:
        if isinstance(value, str):
            value = value.strip()
            return value or None
        return value

    @model_validator(mode="after")
    def _operation_needs(self) -> "EMRInput":
        if self.operation is None:
            self.operation = "lookup" if self.patient_id and not (self.codes or self.condition) else "similar"
        if self.operation == "lookup" and not self.patient_id:
            raise ValueError("lookup needs patient_id, e.g. {\"operation\": \"lookup\", \"patient_id\": \"P00042\"}")
        if self.operation == "similar" and not (self.codes or self.condition):
            raise ValueError("similar needs codes (ICD-10-CM) or a condition phrase")
        if self.age_min is not None and self.age_max is not None and self.age_min > self.age_max:
            raise ValueError("age_min must not exceed age_max")
        return self


def written_input_schema() -> dict[str, Any]:
    """The JSON schema for writing EMR_SEARCH's input (``WRITTEN_INPUT_SCHEMA`` in the tool's metadata):
    similar patients by codes, similar patients by a condition, or one patient's record by id, each with
    what it needs required and ``operation`` left to :class:`EMRInput` to infer. :class:`EMRInput`'s own
    schema requires nothing (its validator asks for codes or a condition, or a patient id), so JSON
    constrained to it can parse and still be refused: Qwen2.5-Coder-1.5B wrote ``{"operation": "similar",
    "sex": "F"}`` (benchmarks/RESULTS.md section 33). ``operation`` is left out because a grammar writes
    a tool's keys in sorted order (``reply_forms``), required ones first: with it, ``{"operation": ...``
    could only have gone on as a look-up. Every value this schema admits, :class:`EMRInput` accepts
    (tests/test_tcrag_forms.py), bar ages in the wrong order and a blank condition; a grammar made from it
    admits an empty list of codes too (count bounds are left out:
    :func:`~tcrag_langgraph.models.constrained.json_schema_rules`)."""
    properties = EMRInput.model_json_schema()["properties"]
    cohort = {k: v for k, v in properties.items() if k not in ("operation", "patient_id")}
    code = {"type": "string", "pattern": _ICD_CODE.pattern}  # codes as the parser writes them

    def written(fields: dict[str, Any], required: str) -> dict[str, Any]:
        return {"type": "object", "properties": fields, "required": [required], "additionalProperties": False}

    by_codes = {**cohort, "codes": {**properties["codes"], "items": code, "minItems": 1}}
    return {"anyOf": [
        written(by_codes, "codes"),
        written({**by_codes, "codes": {**by_codes["codes"], "minItems": 0},
                 "condition": {"type": "string", "minLength": 1, "maxLength": 200}}, "condition"),
        # ASCII digits: what a model writes (the validator's \d also takes other scripts' digits)
        written({"patient_id": {"type": "string", "pattern": r"^P[0-9]{1,6}$"}}, "patient_id"),
    ]}


_FILLER = {
    "patient", "patients", "with", "similar", "find", "search", "show", "list", "get", "who", "have", "has", "had",
    "and", "or", "aged", "age", "ages", "years", "year", "old", "yo", "of", "the", "a", "an", "diagnosed",
    "diagnosis", "diagnoses", "code", "codes", "icd", "icd-10", "icd-10-cm", "cases", "case", "records", "record",
    "me", "for", "all", "any", "between", "to", "in", "on", "look", "up", "lookup", "please", "emr", "like", "that",
    "are", "is", "female", "females", "male", "males", "women", "woman", "men", "man", "over", "under", "older",
    "younger", "than", "above", "below", "from", "id",
}


def parse_emr_text(text: str) -> dict[str, Any]:
    """Read plain text a model wrote into EMR_SEARCH arguments.

    Example:
        >>> parse_emr_text("female patients with E11.9 and heart failure aged 60-80")
        {'codes': ['E11.9'], 'sex': 'F', 'age_min': 60, 'age_max': 80, 'condition': 'heart failure'}
        >>> parse_emr_text("record of P00042")
        {'operation': 'lookup', 'patient_id': 'P00042'}
    """
    out: dict[str, Any] = {}
    rest = text
    for pid in _PID_IN_TEXT.finditer(rest):
        if not _ICD_IN_TEXT.fullmatch(pid.group(1)):  # "P07" is an ICD-10-CM category, "P00042" a patient
            return {"operation": "lookup", "patient_id": pid.group(1)}
    codes = [m.group(1) for m in _ICD_IN_TEXT.finditer(rest)]
    if codes:
        out["codes"] = codes
        rest = _ICD_IN_TEXT.sub(" ", rest)
    low = rest.lower()
    if re.search(r"\b(female|females|women|woman|girls?)\b", low):
        out["sex"] = "F"
    elif re.search(r"\b(male|males|men|man|boys?)\b", low):
        out["sex"] = "M"
    rng = re.search(r"\b(\d{1,3})\s*(?:-|–|to|and)\s*(\d{1,3})\b", low)
    if rng:
        out["age_min"], out["age_max"] = int(rng.group(1)), int(rng.group(2))
        low = low.replace(rng.group(0), " ")
    else:
        lo = re.search(r"(?:over|older than|above|>=?)\s*(\d{1,3})", low)
        hi = re.search(r"(?:under|younger than|below|<=?)\s*(\d{1,3})", low)
        if lo:
            out["age_min"] = int(lo.group(1))
            low = low.replace(lo.group(0), " ")
        if hi:
            out["age_max"] = int(hi.group(1))
            low = low.replace(hi.group(0), " ")
    words = [w for w in re.findall(r"[a-z][a-z0-9'-]*", low) if w not in _FILLER]
    if words:
        out["condition"] = " ".join(words)
    if not out.get("codes") and not out.get("condition"):
        raise ValueError('name ICD-10-CM codes or a condition (e.g. "patients with E11.9") or a patient id (e.g. "P00042")')
    return out
