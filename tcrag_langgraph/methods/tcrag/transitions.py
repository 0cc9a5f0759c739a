"""Algorithm 1 of TC-RAG (paper appendix 8.6) as pure transition functions: the stack machine.

Each function takes the machine (stack, state value, sigma, steps taken) and what the step brought
(the model's text, the state monitor's score, a tool call's record) and returns a
:class:`Transition`: the new stack, the new state value, the trace event and, if the run ends, why.
Nothing here calls a model, a scorer, a tool or LangGraph; the graph nodes (:mod:`.graph`) score,
apply one of these and emit the event. Every rule of the algorithm lives here and nowhere else:

==============  ==================================================================================
Thought         push; ``s <- max(score, sigma)`` (a Thought alone never ends the run)
Plan            push; ``s`` unchanged
Tool_Use        push one frame holding the real call and its observation or error; ``s`` unchanged
Backtrack       pop the top frame (never the User_Query); a popped Thought restores ``s`` from before it
Summary         pop the top frame, push the summary; ``s`` unchanged
Conclusion      ``f = score``; ``f < sigma``: push and halt (validated); else kept as a Thought, ``s <- f``
review reject   the accepted Conclusion becomes a Thought again; ``s <- max(s, sigma)``
repeated call   a Tool_Use identical to one on the stack is not run again: an error frame points at it
step budget     one final Conclusion is scored: validated if ``f < sigma``, else the run halts
                unvalidated with it as the answer
risk            with a stated risk, only a run's first Conclusion can be validated: one accepted after a
                rejection halts ``rewritten_conclusion``, unvalidated (:func:`rewritten_conclusion`)
cannot judge    when the model's calibration says the monitor cannot judge it, its rejection means no
                more than its acceptance: the first Conclusion ends the run ``monitor_cannot_judge``,
                unvalidated (:func:`unjudged_conclusion`), unless the run asks for the loop anyway
rejections      with ``max_rejections=k``, the monitor's rejection number ``k + 1`` ends the run
                ``rejections_spent``, unvalidated, with that Conclusion as the answer
                (:func:`limited_conclusion`; ``k = 0``: the first Conclusion ends every run)
==============  ==================================================================================

Example:
    >>> m = start("Is aspirin an NSAID?", initial_state_value=1e9, sigma=10).machine()
    >>> t = conclusion(m, "Yes.", score=3.2)
    >>> t.halt, t.state_value, [f.action.value for f in t.stack]
    (<HaltReason.VALIDATED: 'validated'>, 3.2, ['User_Query', 'Conclusion'])
    >>> conclusion(m, "Maybe.", score=12.0).event.op
    'reject'
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, replace
from enum import Enum
from typing import Any, Optional, Sequence

from ...core.state import Action, Frame, ToolCallRecord, TraceEvent
from ...tools.tokens import count_tokens
from .state import StackError, pop, push, replace_top

__all__ = [
    "HaltReason",
    "Machine",
    "Transition",
    "start",
    "thought",
    "plan",
    "tool_use",
    "backtrack",
    "summary",
    "conclusion",
    "review_reject",
    "final_conclusion",
    "rewritten_conclusion",
    "unjudged_conclusion",
    "limited_conclusion",
    "rejections_so_far",
    "rejected_conclusion",
    "repeated_conclusion",
    "repeated_call",
    "unanswered_rejection",
    "ways_after_rejection",
    "WAYS_AFTER_REJECTION",
    "unverified_answer",
]


class HaltReason(str, Enum):
    """Why a run ended."""

    VALIDATED = "validated"  # Conclusion accepted with state value < sigma
    CONCLUSION_UNMONITORED = "conclusion_unmonitored"  # monitor off: the model's own Conclusion
    MAX_STEPS = "max_steps"  # step budget spent; the answer is unverified
    REPEATED_CONCLUSION = "repeated_conclusion"  # a Conclusion the monitor rejected, written again
    FORMAT_ERROR = "format_error"  # no parseable action after the allowed re-prompts
    MODEL_ERROR = "model_error"  # the chat model raised
    SCORER_ERROR = "scorer_error"  # the state monitor could not score
    INVALID_INPUT = "invalid_input"  # empty / too long / non-text question
    MONITOR_CANNOT_JUDGE = "monitor_cannot_judge"  # a Conclusion ended the run, but the monitor cannot judge this model
    REWRITTEN_CONCLUSION = "rewritten_conclusion"  # with risk: accepted below sigma after a rejected Conclusion
    REPEATED_CALL = "repeated_call"  # a tool call on the stack written again: a rejection stood, or after a warning
    REJECTIONS_SPENT = "rejections_spent"  # the monitor rejected a Conclusion after max_rejections rejections


@dataclass(frozen=True)
class Machine:
    """What Algorithm 1 reads: the stack, the state value ``s``, sigma and the actions taken so far."""

    stack: list[Frame]
    state_value: float
    sigma: float
    steps: int = 0


@dataclass(frozen=True)
class Transition:
    """The result of one step. ``scored`` is the monitor's raw value (for the state history)."""

    stack: list[Frame]
    state_value: float
    event: TraceEvent
    steps: int
    sigma: float
    scored: Optional[float] = None
    halt: Optional[HaltReason] = None
    state_set: bool = False  # the step (re)set the state value: it enters the state history

    @property
    def answer(self) -> Optional[str]:
        """The run's answer when this step ends it with one: the accepted Conclusion, or (budget
        spent) the top-most text the model wrote; ``None`` while the run goes on."""
        if self.halt in (HaltReason.VALIDATED, HaltReason.CONCLUSION_UNMONITORED, HaltReason.REWRITTEN_CONCLUSION,
                         HaltReason.MONITOR_CANNOT_JUDGE, HaltReason.REJECTIONS_SPENT):
            return self.stack[-1].content
        if self.halt in (HaltReason.MAX_STEPS, HaltReason.REPEATED_CONCLUSION):
            return unverified_answer(self.stack)
        return None

    def machine(self) -> Machine:
        return Machine(stack=self.stack, state_value=self.state_value, sigma=self.sigma, steps=self.steps)


def _frame(action: Action, content: str, step: int, *, before: Optional[float], after: float,
           tool_call: Optional[ToolCallRecord] = None) -> Frame:
    frame = Frame(action=action, content=content, step=step, state_before=before, state_after=after,
                  tool_call=tool_call)
    frame.token_count = count_tokens(frame.render())
    return frame


def _step(m: Machine, stack: list[Frame], value: float, action: str, op: str, *, content: str = "",
          detail: Optional[str] = None, scored: Optional[float] = None,
          halt: Optional[HaltReason] = None, state_set: bool = False) -> Transition:
    step = m.steps + 1
    event = TraceEvent(step=step, action=action, op=op, content=content, stack_depth=len(stack),
                       state_value=value, detail=detail)
    return Transition(stack=stack, state_value=value, event=event, steps=step, sigma=m.sigma, scored=scored,
                      halt=halt, state_set=state_set)


def start(question: str, *, initial_state_value: float, sigma: float) -> Transition:
    """Push the User_Query at the bottom; ``s`` starts at a large value."""
    frame = Frame(action=Action.USER_QUERY, content=question, token_count=count_tokens(question),
                  state_after=initial_state_value)
    stack = push([], frame)
    event = TraceEvent(step=0, action=Action.USER_QUERY.value, op="push", content=question, stack_depth=1,
                       state_value=initial_state_value)
    return Transition(stack=stack, state_value=initial_state_value, event=event, steps=0, sigma=sigma)


def thought(m: Machine, content: str, *, score: Optional[float]) -> Transition:
    """Push a Thought. ``score=None`` (monitor off) leaves ``s`` as it is."""
    after = m.state_value if score is None else max(score, m.sigma)
    frame = _frame(Action.THOUGHT, content, m.steps + 1, before=m.state_value, after=after)
    return _step(m, push(m.stack, frame), after, "Thought", "push", content=content, scored=score,
                 detail=None if score is None else f"scored {score:.4g}", state_set=True)


def plan(m: Machine, content: str) -> Transition:
    frame = _frame(Action.PLAN, content, m.steps + 1, before=m.state_value, after=m.state_value)
    return _step(m, push(m.stack, frame), m.state_value, "Plan", "push", content=content)


def tool_use(m: Machine, record: ToolCallRecord, *, content: str = "", detail: Optional[str] = None) -> Transition:
    """Push one frame holding the real call and what it returned (an error stays an error)."""
    frame = _frame(Action.TOOL_USE, content or record.tool, m.steps + 1, before=m.state_value, after=m.state_value,
                   tool_call=record)
    return _step(m, push(m.stack, frame), m.state_value, "Tool_Use", "push", content=record.observation,
                 detail=detail)


def backtrack(m: Machine) -> Transition:
    """Pop the top frame; popping a Thought restores the state value from before it."""
    try:
        stack, popped = pop(m.stack)
    except StackError as err:
        return _step(m, m.stack, m.state_value, "Backtrack", "noop", detail=f"nothing to pop: {err}")
    restores = popped.action is Action.THOUGHT and popped.state_before is not None
    value = popped.state_before if restores else m.state_value
    return _step(m, stack, value, "Backtrack", "pop", content=popped.render(),
                 detail=f"popped {popped.action.value}", state_set=restores)


def summary(m: Machine, content: str) -> Transition:
    """Replace the top frame with the model's summary of it."""
    frame = _frame(Action.SUMMARY, content, m.steps + 1, before=m.state_value, after=m.state_value)
    try:
        stack, popped = replace_top(m.stack, frame)
    except StackError as err:
        return _step(m, m.stack, m.state_value, "Summary", "noop", content=content,
                     detail=f"nothing to summarise: {err}")
    return _step(m, stack, m.state_value, "Summary", "pop+push", content=content,
                 detail=f"replaced {popped.action.value} ({popped.token_count} tokens)")


def conclusion(m: Machine, content: str, *, score: Optional[float]) -> Transition:
    """Accept a Conclusion whose score is below sigma; otherwise keep it as a Thought with ``s <- f``.

    ``score=None`` means the state monitor is off (an ablation): the Conclusion is taken as written.
    """
    step = m.steps + 1
    if score is None:
        frame = _frame(Action.CONCLUSION, content, step, before=m.state_value, after=m.state_value)
        return _step(m, push(m.stack, frame), m.state_value, "Conclusion", "push", content=content,
                     detail="state monitor off: accepted as written", halt=HaltReason.CONCLUSION_UNMONITORED)
    if score < m.sigma:
        return _ended_by(m, content, score, detail=f"accepted: {score:.4g} < sigma {m.sigma:g}",
                         halt=HaltReason.VALIDATED)
    frame = _frame(Action.THOUGHT, content, step, before=m.state_value, after=score)
    return _step(m, push(m.stack, frame), score, "Conclusion", "reject", content=content, scored=score,
                 detail=f"rejected: {score:.4g} >= sigma {m.sigma:g}; kept as a Thought", state_set=True)


def review_reject(m: Machine, feedback: Optional[str]) -> Transition:
    """A human reviewer rejected the accepted Conclusion on top: it becomes a Thought again.

    The state value goes back to at least sigma, so the run cannot halt before a new Conclusion.
    Not an action of the model: the step count does not change.
    """
    stack, popped = pop(m.stack)
    value = max(m.state_value, m.sigma)
    note = popped.content if not feedback else f"{popped.content}\n(Reviewer rejected this: {feedback})"
    frame = _frame(Action.THOUGHT, note, popped.step, before=popped.state_before, after=value)
    stack = push(stack, frame)
    event = TraceEvent(step=m.steps, action="Human_Review", op="reject", content=note, stack_depth=len(stack),
                       state_value=value, detail="rejected by the human reviewer")
    return Transition(stack=stack, state_value=value, event=event, steps=m.steps, sigma=m.sigma)


def final_conclusion(m: Machine, content: str, *, score: Optional[float]) -> Transition:
    """The step budget is spent and the model wrote its last Conclusion: scored once like any
    Conclusion; validated if ``f < sigma``, otherwise the run halts unvalidated with this Conclusion
    as its answer (with the monitor off too: the budget, not the model, ended the run)."""
    t = conclusion(m, content, score=score)
    if t.halt is HaltReason.VALIDATED:
        return t
    return replace(t, halt=HaltReason.MAX_STEPS)


def unjudged_conclusion(m: Machine, content: str, *, score: Optional[float]) -> Transition:
    """A Conclusion when the monitor cannot judge this model (its calibration found no sigma that
    separates right from wrong answers): scored and pushed as the answer, and the run halts
    ``monitor_cannot_judge``, unvalidated, whether the value fell below sigma or not.

    Why: a rejection by a monitor that cannot tell right from wrong is noise, and each one costs the
    loop a search and a new Conclusion. With Qwen2.5-Coder-1.5B (shipped cppl calibration AUROC 0.32)
    the main job's diabetes question concluded "Metformin." at step 2, was rejected, searched to the
    6-step budget and ended ``monitor_cannot_judge`` anyway: 25.5 s, now 5.7 s (benchmarks/RESULTS.md
    section 23)."""
    if score is None or score < m.sigma:  # monitor off, or accepted (the kernel marks it cannot-judge)
        return conclusion(m, content, score=score)
    return _ended_by(m, content, score, halt=HaltReason.MONITOR_CANNOT_JUDGE,
                     detail=f"{score:.4g} >= sigma {m.sigma:g}, but the monitor cannot judge this model: ended unvalidated")


def limited_conclusion(m: Machine, content: str, *, score: Optional[float], rejections: int,
                       max_rejections: int) -> Transition:
    """A Conclusion when a run may be rejected at most ``max_rejections`` times and ``rejections`` have
    happened: as :func:`conclusion`, except that a rejection beyond the limit pushes the Conclusion as
    the answer and halts ``rejections_spent``, unvalidated (the monitor's verdict, kept; no new search).

    Why: with Qwen2.5-Coder-1.5B on PubMedQA-L (answer_prob, sigma 0.4651) a third of the runs had a
    rejection; those carried 61 % of TC-RAG's tokens (3.40x ReAct's), and the search after it changed
    the final answer in 3 of 67 test runs and 0 of 19 trainval runs (benchmarks/RESULTS.md section 31).
    ``max_rejections=0`` keeps the monitor's verdict on the first Conclusion at about ReAct's cost."""
    if score is None or score < m.sigma or rejections < max_rejections:  # monitor off, accepted, or may go on
        return conclusion(m, content, score=score)
    return _ended_by(m, content, score, halt=HaltReason.REJECTIONS_SPENT,
                     detail=f"rejected: {score:.4g} >= sigma {m.sigma:g}, after {rejections} earlier rejection(s) "
                            f"of at most {max_rejections}: ended unvalidated")


def rejections_so_far(trace: Sequence[TraceEvent]) -> int:
    """How many Conclusions the state monitor has rejected in this run."""
    return sum(1 for e in trace if e.action == Action.CONCLUSION.value and e.op == "reject")


def _ended_by(m: Machine, content: str, score: float, *, detail: str, halt: HaltReason) -> Transition:
    """The Conclusion pushed as the run's answer with ``s <- f``, and the run halts for ``halt``."""
    frame = _frame(Action.CONCLUSION, content, m.steps + 1, before=m.state_value, after=score)
    return _step(m, push(m.stack, frame), score, "Conclusion", "push", content=content, scored=score,
                 detail=detail, halt=halt, state_set=True)


def rewritten_conclusion(t: Transition, trace: Sequence[TraceEvent]) -> Transition:
    """With a stated risk: ``t`` unchanged unless it validates a Conclusion written after the monitor
    rejected one in this run; that one halts ``rewritten_conclusion``, unvalidated, as the answer.

    Why: the risk's calibration measured the state value of runs' *first* Conclusions, and its
    guarantee holds for answers exchangeable with those. A Conclusion written again after a rejection
    is kept *because* its value fell below sigma: selected, not exchangeable. On 60 PubMedQA-L test
    questions at risk 0.4 (session 18, the 1.5B, gen_answer_prob) the validated answers were 48.3 %
    wrong with re-written ones counted; 40.5 % among first Conclusions (37 of 60)."""
    if t.halt is not HaltReason.VALIDATED:
        return t
    if not rejections_so_far(trace):
        return t
    return replace(t, halt=HaltReason.REWRITTEN_CONCLUSION)


def _normalised_text(text: str) -> str:
    return re.sub(r"[\W_]+", " ", text.casefold()).strip()


def _normalised_input(tool_input: Any) -> str:
    if isinstance(tool_input, str):
        text = tool_input
    else:
        try:
            text = json.dumps(tool_input, sort_keys=True, ensure_ascii=False, default=str)
        except (TypeError, ValueError):
            text = str(tool_input)
    return _normalised_text(text)


def rejected_conclusion(trace: Sequence[TraceEvent], content: str, *, latest: bool = False) -> Optional[TraceEvent]:
    """The trace event of an earlier Conclusion the monitor rejected with the same text (equal after
    normalising case, spacing and punctuation), if any: the first such, or with ``latest`` the last."""
    key = _normalised_text(content)
    found = None
    for event in trace:
        if event.action == Action.CONCLUSION.value and event.op == "reject" and _normalised_text(event.content) == key:
            if not latest:
                return event
            found = event
    return found


#: what the model may do after the monitor rejected its Conclusion, until one of them changed the stack
WAYS_AFTER_REJECTION = ("Tool_Use", "Backtrack", "Summary")


def unanswered_rejection(trace: Sequence[TraceEvent]) -> Optional[TraceEvent]:
    """The monitor's latest rejection of a Conclusion, unless the stack has changed since in a way that
    can change the answer: a tool call that returned a real observation, a Backtrack that popped, or a
    Summary that replaced a frame. Thoughts, Plans, refused repeats and tool errors do not answer it
    (a 1.5B model wrote the rejected Conclusion again after them, every time)."""
    for event in reversed(trace):
        if event.action == Action.CONCLUSION.value and event.op == "reject":
            return event
        if event.action == Action.TOOL_USE.value and event.op == "push" and _call_error(event) is None:
            return None
        if (event.action, event.op) in ((Action.BACKTRACK.value, "pop"), (Action.SUMMARY.value, "pop+push")):
            return None
    return None


def ways_after_rejection(allowed: Sequence[str]) -> list[str]:
    """The actions offered while a rejection is unanswered: those of :data:`WAYS_AFTER_REJECTION` this
    run has (none: ``allowed`` unchanged, e.g. closed book without Backtrack and Summary)."""
    ways = [a for a in WAYS_AFTER_REJECTION if a in allowed]
    return ways or list(allowed)


def _call_error(event: TraceEvent) -> Optional[str]:
    try:
        return json.loads(event.detail or "{}").get("error")
    except (ValueError, AttributeError):
        return "unknown"


def evidence_since(trace: Sequence[TraceEvent], step: int) -> bool:
    """Whether a tool call after ``step`` put a real observation on the stack (an error or a refused
    repeat is no evidence)."""
    for event in trace:
        if event.step > step and event.action == Action.TOOL_USE.value and event.op == "push":
            if _call_error(event) is None:
                return True
    return False


def repeated_conclusion(m: Machine, content: str, earlier: TraceEvent) -> Transition:
    """The model wrote again a Conclusion the monitor already rejected at ``earlier``.

    Its state value depends only on its own text and the User_Query (eq. 2 and 3), so scoring it
    again would reject it again, and a model that repeats itself under greedy decoding keeps doing
    so until the budget is spent. The run halts here, unvalidated, with this Conclusion as its
    answer: the same outcome as at the budget, without spending it.
    """
    step = m.steps + 1
    frame = _frame(Action.THOUGHT, content, step, before=m.state_value, after=m.state_value)
    return _step(m, push(m.stack, frame), m.state_value, "Conclusion", "reject", content=content,
                 detail=f"repeated: the same Conclusion was rejected at step {earlier.step} "
                        f"({earlier.state_value:.4g} >= sigma {m.sigma:g}); not scored again",
                 halt=HaltReason.REPEATED_CONCLUSION)


def repeated_call(stack: list[Frame], tool: str, tool_input: Any) -> Optional[Frame]:
    """The frame on the stack holding the same call (same tool, input equal after normalising case,
    spacing, punctuation and JSON key order), if any."""
    key = _normalised_input(tool_input)
    for frame in reversed(stack):
        call = frame.tool_call
        if frame.action is Action.TOOL_USE and call is not None and call.error_kind != "repeated_call":
            if call.tool == tool and _normalised_input(call.tool_input) == key:
                return frame
    return None


#: Frames whose text the model wrote itself; only these can stand as an unverified answer.
_MODEL_TEXT = (Action.CONCLUSION, Action.THOUGHT, Action.SUMMARY)


def unverified_answer(stack: list[Frame]) -> Optional[str]:
    """The answer of a run that did not validate: the top-most text the model wrote itself
    (Algorithm 1 returns top(M); a tool observation or the question is never an answer)."""
    for frame in reversed(stack[1:]):
        if frame.action in _MODEL_TEXT:
            return frame.content
    return None
