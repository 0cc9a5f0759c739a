"""The seeded synthetic cohort: deterministic patients, admissions, diagnoses, medications and labs.

Built from the clinical profiles in ``tools/data/emr_profiles.json``: real ICD-10-CM codes and
descriptions (``simple-icd-10-cm``), plausible comorbidity clusters, medications and lab values.
All people are fictitious; the free-text notes quote their identifiers on purpose, as real notes
do, so that the redaction is exercised.
"""

from __future__ import annotations

import json
import random
from datetime import datetime, timedelta
from functools import cache
from importlib import resources
from typing import Any, Iterable, Sequence

__all__ = ["load_profiles", "generate_cohort"]


@cache
def load_profiles() -> dict[str, Any]:
    """The packaged clinical profiles (``tools/data/emr_profiles.json``)."""
    text = resources.files("tcrag_langgraph.tools").joinpath("data/emr_profiles.json").read_text(encoding="utf-8")
    return json.loads(text)


def _icd_descriptions(codes: Iterable[str]) -> dict[str, str]:
    """Real ICD-10-CM descriptions; a code the installed release lacks is a data bug, so fail loudly."""
    import simple_icd_10_cm as cm

    out = {}
    for code in sorted(set(codes)):
        if not cm.is_valid_item(code) or not cm.is_leaf(code):
            raise ValueError(f"emr_profiles.json uses {code!r}, which is not a billable ICD-10-CM code")
        out[code] = cm.get_description(code)
    return out


def _weighted(rng: random.Random, pairs: Sequence[Sequence[Any]]) -> Any:
    return rng.choices([p[0] for p in pairs], weights=[p[1] for p in pairs], k=1)[0]


def generate_cohort(n_patients: int = 300, seed: int = 7) -> dict[str, list[dict[str, Any]]]:
    """Rows for every table, fully determined by ``(n_patients, seed)``.

    Each patient gets a primary condition fitting their age, comorbidities drawn from the
    profile's co-occurrence probabilities, 1-3 admissions, the matching medications and lab
    values inside the condition's typical range (otherwise the normal range).

    Example:
        >>> a, b = generate_cohort(20, seed=1), generate_cohort(20, seed=1)
        >>> a == b, len(a["patients"])
        (True, 20)
    """
    if not 1 <= n_patients <= 100_000:
        raise ValueError("n_patients must be between 1 and 100000")
    prof = load_profiles()
    conditions: dict[str, dict[str, Any]] = prof["conditions"]
    lab_defs: dict[str, dict[str, Any]] = prof["labs"]
    rng = random.Random(seed)
    descriptions = _icd_descriptions(c for cond in conditions.values() for c in cond["codes"])
    rows: dict[str, list[dict[str, Any]]] = {
        "d_icd_diagnoses": [{"icd_code": c, "long_title": d} for c, d in descriptions.items()],
        "patients": [],
        "admissions": [],
        "diagnoses": [],
        "medications": [],
        "labs": [],
    }
    used_mrns: set[str] = set()
    admission_id = 100_000
    start = datetime(2018, 1, 1, 8, 0)

    def lab_value(label: str, active: list[str]) -> float:
        spec = lab_defs[label]
        lo, hi = spec["normal"]
        for key in active:  # the admission's reason first: it drives the abnormal values
            if label in conditions[key]["labs"]:
                lo, hi = conditions[key]["labs"][label]
                break
        return round(rng.uniform(lo, hi), spec["decimals"])

    for n in range(1, n_patients + 1):
        pid = f"P{n:05d}"
        sex = rng.choice("FM")
        age0 = int(min(95, max(18, rng.triangular(18, 96, 68))))
        eligible = [(k, c["weight"]) for k, c in conditions.items() if c["age"][0] <= age0 <= c["age"][1]]
        primary = _weighted(rng, eligible)
        chronic = [primary] if conditions[primary]["chronic"] else []
        for key, prob in conditions[primary]["comorbid"].items():
            if key not in chronic and rng.random() < prob and conditions[key]["chronic"]:
                chronic.append(key)
        # one code per condition per patient, so repeat admissions stay consistent
        code_of = {k: rng.choice(c["codes"]) for k, c in conditions.items()}
        mrn = f"{rng.randrange(10**7, 10**8)}"
        while mrn in used_mrns:
            mrn = f"{rng.randrange(10**7, 10**8)}"
        used_mrns.add(mrn)
        first = rng.choice(prof["first_names"][sex])
        last = rng.choice(prof["last_names"])
        first_admit = start + timedelta(days=rng.randrange(0, 5 * 365), hours=rng.randrange(0, 14))
        birth = (first_admit - timedelta(days=int(age0 * 365.25) + rng.randrange(0, 365))).date()
        address = f"{rng.randrange(10, 9999)} {rng.choice(prof['streets'])}, {rng.choice(prof['cities'])}"
        phone = f"555-{rng.randrange(100, 999)}-{rng.randrange(1000, 9999)}"
        rows["patients"].append(
            dict(patient_id=pid, mrn=mrn, first_name=first, last_name=last, sex=sex,
                 birth_date=birth, address=address, phone=phone)
        )
        n_adm = 1 + (rng.random() < 0.4) + (rng.random() < 0.15)
        admit = first_admit
        for i in range(n_adm):
            age = admit.year - birth.year - ((admit.month, admit.day) < (birth.month, birth.day))
            if i == 0:
                reason = primary
            else:
                acute = [(k, c["weight"]) for k, c in conditions.items()
                         if not c["chronic"] and c["age"][0] <= age <= c["age"][1]]
                reason = _weighted(rng, acute) if acute and rng.random() < 0.6 else primary
            active = [reason] + [k for k in chronic if k != reason]
            if reason != primary and not conditions[reason]["chronic"]:
                for key, prob in conditions[reason]["comorbid"].items():
                    if key not in active and not conditions[key]["chronic"] and rng.random() < prob / 2:
                        active.insert(1, key)
            los = max(1, int(rng.gammavariate(2.0, 2.2)))
            discharge = admit + timedelta(days=los, hours=rng.randrange(0, 10))
            disposition = _weighted(rng, prof["dispositions"])
            adm_type = "ELECTIVE" if reason in ("hld", "obesity", "gerd") else _weighted(rng, prof["admission_types"])
            reason_text = descriptions[code_of[reason]]
            title = "Ms." if sex == "F" else "Mr."
            # Notes quote identifiers, as real notes do: the redactor must remove them.
            note = (
                f"{title} {first} {last} (MRN {mrn}, DOB {birth:%m/%d/%Y}) presented with "
                f"{reason_text.lower()}. Lives at {address}; contact {phone}. "
                f"Hospital course {los} day(s); discharged to {disposition.lower()}."
            )
            rows["admissions"].append(
                dict(admission_id=admission_id, patient_id=pid, admit_time=admit, discharge_time=discharge,
                     age_at_admit=age, admission_type=adm_type, disposition=disposition, note=note)
            )
            for seq, key in enumerate(active, 1):
                rows["diagnoses"].append(
                    dict(admission_id=admission_id, patient_id=pid, seq_num=seq, icd_code=code_of[key])
                )
            seen_drugs: set[str] = set()
            for key in active:
                meds = conditions[key]["medications"]
                for drug, dose, route in rng.sample(meds, k=min(len(meds), rng.randint(1, 2))) if meds else []:
                    if drug in seen_drugs:
                        continue
                    seen_drugs.add(drug)
                    rows["medications"].append(
                        dict(admission_id=admission_id, patient_id=pid, drug=drug, dose=dose, route=route,
                             start_time=admit + timedelta(hours=rng.randrange(1, 12)))
                    )
            wanted = list(prof["base_labs"])
            for key in active:
                wanted += [lab for lab in conditions[key]["labs"] if lab not in wanted]
            for label in wanted:
                spec = lab_defs[label]
                value = lab_value(label, active)
                flag = "H" if value > spec["high"] else "L" if value < spec["low"] else None
                rows["labs"].append(
                    dict(admission_id=admission_id, patient_id=pid, label=label, value=value, unit=spec["unit"],
                         ref_low=spec["low"], ref_high=spec["high"], flag=flag,
                         chart_time=admit + timedelta(hours=rng.randrange(1, 24)))
                )
            admission_id += 1
            if disposition == "DIED":
                break
            admit = discharge + timedelta(days=rng.randrange(20, 700))
    return rows