"""The TC-RAG stack machine as a LangGraph ``StateGraph``.

Nodes: ``Start`` (validate input, push the User_Query), ``Generate`` (ask the model for one action,
repair or re-prompt on bad format, enforce the step budget), one node per action (``Thought``,
``Plan``, ``Tool_Use``, ``Summary``, ``Backtrack``, ``Conclusion``) and ``Human_Review`` (optional
approval before a Conclusion is accepted). Every node routes with ``Command``, so the drawing in
``get_graph()`` and in LangGraph Studio shows all transitions.

Example:
    >>> from langchain_core.language_models.fake_chat_models import FakeListChatModel
    >>> from tcrag_langgraph import build_graph, TCRAGConfig
    >>> class Scorer:
    ...     def score(self, query, text, *, metric): return 1.0
    >>> graph = build_graph(model=FakeListChatModel(responses=["Conclusion: yes"]), scorer=Scorer())
    >>> out = graph.invoke({"question": "Is aspirin an NSAID?"})
    >>> out["answer"], out["answer_validated"], out["halt_reason"]
    ('yes', True, 'validated')
"""

from __future__ import annotations

import concurrent.futures
import json
import re
import time
from typing import Any, Callable, Literal, Optional, Sequence

from langchain_core.callbacks.manager import dispatch_custom_event
from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, SystemMessage
from langchain_core.runnables import RunnableConfig
from langchain_core.tools import BaseTool
from langgraph.config import get_stream_writer
from langgraph.graph import END, START, StateGraph
from langgraph.runtime import Runtime
from langgraph.types import Command, interrupt

from .actions import ActionParseError, format_instructions, parse_action
from .config import CALLER_KEY, TCRAGConfig, resolve_config
from .prompting import demonstrations, message_text, system_prompt, turn_text
from .scoring import StateScorer
from .state import Action, Frame, TCRAGState, ToolCallRecord, TraceEvent, pop, push, render_stack, replace_top
from .tools.tokens import count_tokens, trim_to_tokens

__all__ = ["build_graph", "question_problem", "EVENT_NAME", "NODE_NAMES", "HALT_REASONS"]

#: Name of the custom events (``stream_mode="custom"`` payload ``type`` and ``astream_events`` name).
EVENT_NAME = "tcrag"
NODE_NAMES = ("Start", "Generate", "Thought", "Plan", "Tool_Use", "Summary", "Backtrack", "Conclusion", "Human_Review")
HALT_REASONS = (
    "validated",  # Conclusion accepted with state value < sigma
    "conclusion_unmonitored",  # state monitor switched off: the model's own Conclusion
    "max_steps",  # step budget spent; the answer is the top frame, unverified
    "format_error",  # no parseable action after the allowed re-prompts
    "model_error",  # the chat model raised
    "scorer_error",  # the state monitor could not score
    "invalid_input",  # empty / too long / non-text question
)
# Generation stops before the model invents a tool result or a new turn. Further actions in the
# same reply are left to the parser (small models often write an empty label, then the action).
STOP_SEQUENCES = ["\nTool_Observation:", "\nObservation:", "\nTool_Error:", "\nUser_Query:", "\nBegin!",
                  "\nWrite your next action"]
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x0c\x0e-\x1f\x7f]")


class _Machine:
    """Holds the model, tools and scorer; its methods are the graph nodes."""

    def __init__(
        self,
        model: Optional[BaseChatModel],
        tools: Sequence[BaseTool],
        scorer: Optional[StateScorer | Callable[..., float]],
        config: TCRAGConfig,
    ) -> None:
        self._model = model
        self.tools = {t.name: t for t in tools}
        if len(self.tools) != len(tools):
            raise ValueError("tool names must be unique")
        self._scorer = scorer
        self.base_config = config

    # ----- lazily built defaults (the packaged local model) -----
    @property
    def model(self) -> BaseChatModel:
        if self._model is None:
            from .models import LocalChatModel

            self._model = LocalChatModel(
                max_new_tokens=self.base_config.max_new_tokens, temperature=self.base_config.temperature
            )
        return self._model

    def score(self, query: str, text: str, metric: str) -> float:
        if self._scorer is None:
            from .models import LocalChatModel
            from .scoring import LocalLMScorer

            shared = self._model.local_model if isinstance(self._model, LocalChatModel) else None
            self._scorer = LocalLMScorer(shared)
        if hasattr(self._scorer, "score"):
            value = self._scorer.score(query, text, metric=metric)
        else:
            value = self._scorer(query, text, metric=metric)
        value = float(value)
        if value != value:  # NaN never passes or fails a threshold meaningfully
            raise ValueError("the scorer returned NaN")
        return value

    def cfg(self, config: RunnableConfig, runtime: Runtime) -> TCRAGConfig:
        return resolve_config(
            self.base_config,
            configurable=(config or {}).get("configurable"),
            context=getattr(runtime, "context", None),
        )

    # ----- helpers -----
    @staticmethod
    def record(state: TCRAGState, config: RunnableConfig, event: TraceEvent) -> list[TraceEvent]:
        """Emit ``event`` live (custom stream + callbacks) and return the extended trace."""
        payload = {"type": EVENT_NAME, **event.model_dump()}
        try:
            get_stream_writer()(payload)
        except Exception:  # outside a graph run there is no stream to write to
            pass
        try:
            dispatch_custom_event(EVENT_NAME, payload, config=config)
        except Exception:  # no callback manager / parent run: nothing listens
            pass
        return [*state.get("trace", []), event]

    def halt(
        self,
        state: TCRAGState,
        config: RunnableConfig,
        *,
        reason: str,
        answer: Optional[str],
        validated: bool,
        error: Optional[str] = None,
        extra: Optional[dict[str, Any]] = None,
    ) -> Command:
        update: dict[str, Any] = dict(extra or {})
        stack = update.get("stack", state.get("stack", []))
        steps = update.get("steps", state.get("steps", 0))
        value = update.get("state_value", state.get("state_value"))
        trace_state = {**state, "trace": update.get("trace", state.get("trace", []))}
        event = TraceEvent(
            step=steps, action="Halt", op="halt", content=answer or "", stack_depth=len(stack),
            state_value=value, detail=reason if error is None else f"{reason}: {error}",
        )
        text = answer if answer else f"No answer: {error or reason}"
        update.update(
            trace=self.record(trace_state, config, event),
            answer=answer,
            answer_validated=validated,
            halt_reason=reason,
            error=error,
            pending_action=None,
            messages=[
                AIMessage(
                    content=text,
                    response_metadata={
                        "answer_validated": validated, "halt_reason": reason,
                        "state_value": value, "sigma": state.get("sigma"),
                    },
                )
            ],
        )
        return Command(goto=END, update=update)

    # ----- nodes -----
    def start(self, state: TCRAGState, config: RunnableConfig, runtime: Runtime) -> Command[Literal["Generate", "__end__"]]:
        cfg = self.cfg(config, runtime)
        base = {
            "stack": [], "trace": [], "steps": 0, "llm_calls": 0, "format_retries": 0, "format_feedback": [],
            "state_history": [], "answer": None, "answer_validated": False, "halt_reason": None, "error": None,
            "sigma": cfg.effective_sigma, "metric": cfg.metric, "state_value": cfg.initial_state_value,
            "token_usage": {"prompt": 0, "completion": 0}, "tool_calls": 0, "pending_action": None,
        }
        question, problem = _extract_question(state, cfg)
        if problem is not None:
            # The question of an earlier turn on this thread must not look like this run's.
            return self.halt({**state, **base}, config, reason="invalid_input", answer=None, validated=False,
                             error=problem, extra={**base, "question": None})
        frame = Frame(action=Action.USER_QUERY, content=question, token_count=count_tokens(question),
                      state_after=cfg.initial_state_value)
        update = {**base, "question": question, "stack": [frame]}
        if not _last_human_is(state, question):
            update["messages"] = [HumanMessage(content=question)]
        update["trace"] = self.record({**state, **base}, config, TraceEvent(
            step=0, action=Action.USER_QUERY.value, op="push", content=question, stack_depth=1,
            state_value=cfg.initial_state_value))
        return Command(goto="Generate", update=update)

    def generate(self, state: TCRAGState, config: RunnableConfig, runtime: Runtime) -> Command[
        Literal["Thought", "Plan", "Tool_Use", "Summary", "Backtrack", "Conclusion", "Generate", "__end__"]
    ]:
        cfg = self.cfg(config, runtime)
        stack = state["stack"]
        if state.get("steps", 0) >= cfg.max_steps:
            return self.halt(state, config, reason="max_steps", answer=_unverified_answer(stack), validated=False,
                             error=f"step budget of {cfg.max_steps} actions spent before a validated Conclusion")
        allowed = cfg.allowed_actions(has_tools=bool(self.tools))
        tools = list(self.tools.values())
        messages: list[BaseMessage] = [SystemMessage(content=system_prompt(tools, allowed, language=cfg.language))]
        if cfg.few_shot:
            for shown, reply in demonstrations(tools, allowed, language=cfg.language):
                messages += [HumanMessage(content=shown), AIMessage(content=reply)]
        messages.append(HumanMessage(content=turn_text(render_stack(stack))))
        for item in state.get("format_feedback", []):
            messages += [AIMessage(content=item["output"]), HumanMessage(content=item["error"])]
        try:
            reply = self._invoke_model(messages, cfg, config)
        except Exception as exc:  # a model/server failure ends the run cleanly, with the reason
            return self.halt(state, config, reason="model_error", answer=None, validated=False,
                             error=f"{type(exc).__name__}: {exc}")
        text = message_text(reply.content)
        usage = dict(state.get("token_usage") or {"prompt": 0, "completion": 0})
        usage["prompt"] += sum(count_tokens(message_text(m.content)) for m in messages)
        usage["completion"] += count_tokens(text)
        common = {"llm_calls": state.get("llm_calls", 0) + 1, "token_usage": usage}
        try:
            parsed = parse_action(text, list(self.tools), allowed=allowed,
                                  unlabeled_as="Thought" if cfg.unlabeled_text == "thought" else None)
        except ActionParseError as err:
            retries = state.get("format_retries", 0) + 1
            trace = self.record(state, config, TraceEvent(
                step=state.get("steps", 0), action="Format_Error", op="format_error", content=text[:500],
                stack_depth=len(stack), state_value=state.get("state_value"), detail=str(err)))
            if retries > cfg.max_format_retries:
                return self.halt(state, config, reason="format_error", answer=_unverified_answer(stack),
                                 validated=False, error=f"no usable action after {retries} tries: {err}",
                                 extra={**common, "trace": trace, "format_retries": retries})
            feedback = [*state.get("format_feedback", []), {
                "output": text[:2000] or "(empty)",
                "error": f"Your reply could not be used: {err}.\n" + format_instructions(allowed, list(self.tools)),
            }]
            return Command(goto="Generate", update={**common, "trace": trace, "format_retries": retries,
                                                      "format_feedback": feedback})
        pending = {"action": parsed.action.value, "content": parsed.content, "tool": parsed.tool,
                   "tool_input": parsed.tool_input, "repairs": list(parsed.repairs)}
        return Command(goto=parsed.action.value,
                       update={**common, "pending_action": pending, "format_retries": 0, "format_feedback": []})

    def _invoke_model(self, messages: list[BaseMessage], cfg: TCRAGConfig, config: RunnableConfig) -> BaseMessage:
        from .models import LocalChatModel

        model = self.model
        kwargs: dict[str, Any] = {"stop": STOP_SEQUENCES}
        if isinstance(model, LocalChatModel):  # only our model takes these per call
            kwargs.update(max_new_tokens=cfg.max_new_tokens, temperature=cfg.temperature)
        try:
            return model.invoke(messages, config=_child_config(config), **kwargs)
        except TypeError:  # a model that rejects `stop`: observations are still dropped by the parser
            return model.invoke(messages, config=_child_config(config))

    def _step_update(self, state: TCRAGState, config: RunnableConfig, *, stack: list[Frame], event: TraceEvent,
                     state_value: Optional[float] = None, history_value: Optional[float] = None) -> dict[str, Any]:
        update: dict[str, Any] = {"stack": stack, "steps": event.step, "pending_action": None,
                                  "trace": self.record(state, config, event)}
        if state_value is not None:
            update["state_value"] = state_value
        if history_value is not None or state_value is not None:
            update["state_history"] = [*state.get("state_history", []), {
                "step": event.step, "action": event.action, "value": state_value if state_value is not None else state.get("state_value"),
                "raw": history_value}]
        return update

    def _new_frame(self, action: Action, content: str, step: int, **kw: Any) -> Frame:
        frame = Frame(action=action, content=content, step=step, **kw)
        frame.token_count = count_tokens(frame.render())
        return frame

    def thought(self, state: TCRAGState, config: RunnableConfig, runtime: Runtime) -> Command[Literal["Generate", "__end__"]]:
        cfg = self.cfg(config, runtime)
        content = state["pending_action"]["content"]
        step = state.get("steps", 0) + 1
        before = state["state_value"]
        raw = None
        after = before
        if cfg.enable_state_monitor:
            try:
                raw = self.score(state["question"], content, cfg.metric)
            except Exception as exc:
                return self.halt(state, config, reason="scorer_error", answer=None, validated=False,
                                 error=f"{type(exc).__name__}: {exc}")
            after = max(raw, state["sigma"])  # a Thought alone never ends the run
        frame = self._new_frame(Action.THOUGHT, content, step, state_before=before, state_after=after)
        stack = push(state["stack"], frame)
        event = TraceEvent(step=step, action="Thought", op="push", content=content, stack_depth=len(stack),
                           state_value=after, detail=None if raw is None else f"scored {raw:.4g}")
        return Command(goto="Generate", update=self._step_update(
            state, config, stack=stack, event=event, state_value=after, history_value=raw))

    def plan(self, state: TCRAGState, config: RunnableConfig) -> Command[Literal["Generate"]]:
        content = state["pending_action"]["content"]
        step = state.get("steps", 0) + 1
        stack = push(state["stack"], self._new_frame(Action.PLAN, content, step,
                                                     state_before=state["state_value"], state_after=state["state_value"]))
        event = TraceEvent(step=step, action="Plan", op="push", content=content, stack_depth=len(stack),
                           state_value=state["state_value"])
        return Command(goto="Generate", update=self._step_update(state, config, stack=stack, event=event))

    def tool_use(self, state: TCRAGState, config: RunnableConfig, runtime: Runtime) -> Command[Literal["Generate"]]:
        cfg = self.cfg(config, runtime)
        pending = state["pending_action"]
        step = state.get("steps", 0) + 1
        tool = self.tools[pending["tool"]]
        tool_input = pending.get("tool_input")
        if tool_input is None or tool_input == "":
            tool_input = state["question"]  # the paper's Tool_Use names only the tool: search the query
        record = self._call_tool(tool, tool_input, cfg, config)
        frame = self._new_frame(Action.TOOL_USE, pending.get("content") or tool.name, step, tool_call=record,
                                state_before=state["state_value"], state_after=state["state_value"])
        stack = push(state["stack"], frame)
        event = TraceEvent(step=step, action="Tool_Use", op="push", content=record.observation,
                           stack_depth=len(stack), state_value=state["state_value"],
                           detail=json.dumps({"tool": tool.name, "input": tool_input, "error": record.error_kind},
                                             ensure_ascii=False, default=str))
        update = self._step_update(state, config, stack=stack, event=event)
        update["tool_calls"] = state.get("tool_calls", 0) + 1
        return Command(goto="Generate", update=update)

    def _call_tool(self, tool: BaseTool, tool_input: Any, cfg: TCRAGConfig, config: RunnableConfig) -> ToolCallRecord:
        from .tools.base import ToolError  # tools/ is installed as tcrag_langgraph.tools

        child = _child_config(config)
        child["configurable"] = {**child.get("configurable", {}), CALLER_KEY: cfg.caller}
        pool = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="tcrag-tool")
        try:
            future = pool.submit(tool.invoke, tool_input, child)
            result = future.result(timeout=cfg.tool_timeout_s)
        except concurrent.futures.TimeoutError:
            result = ToolError(tool.name, "timeout", f"no answer within {cfg.tool_timeout_s:g} s")
        except Exception as exc:  # a raising tool is an error frame, never evidence
            result = ToolError(tool.name, "exception", f"{type(exc).__name__}: {exc}")
        finally:
            pool.shutdown(wait=False, cancel_futures=True)
        if isinstance(result, ToolError):
            return ToolCallRecord(tool=tool.name, tool_input=tool_input, observation=str(result), is_error=True,
                                  error_kind=result.kind)
        observation = message_text(getattr(result, "content", result))
        if not observation.strip():
            return ToolCallRecord(tool=tool.name, tool_input=tool_input, is_error=True, error_kind="bad_response",
                                  observation=f"[{tool.name} error: bad_response] the tool returned nothing")
        return ToolCallRecord(tool=tool.name, tool_input=tool_input,
                              observation=trim_to_tokens(observation, cfg.max_observation_tokens))

    def backtrack(self, state: TCRAGState, config: RunnableConfig) -> Command[Literal["Generate"]]:
        step = state.get("steps", 0) + 1
        stack = state["stack"]
        value = state["state_value"]
        if len(stack) <= 1:
            event = TraceEvent(step=step, action="Backtrack", op="noop", stack_depth=len(stack), state_value=value,
                               detail="nothing to pop: the User_Query stays at the bottom")
            return Command(goto="Generate", update=self._step_update(state, config, stack=stack, event=event))
        stack, popped = pop(stack)
        if popped.action is Action.THOUGHT and popped.state_before is not None:
            value = popped.state_before  # restore the state value from before that Thought
        event = TraceEvent(step=step, action="Backtrack", op="pop", content=popped.render(), stack_depth=len(stack),
                           state_value=value, detail=f"popped {popped.action.value}")
        return Command(goto="Generate", update=self._step_update(
            state, config, stack=stack, event=event,
            state_value=value if popped.action is Action.THOUGHT else None))

    def summary(self, state: TCRAGState, config: RunnableConfig) -> Command[Literal["Generate"]]:
        step = state.get("steps", 0) + 1
        content = state["pending_action"]["content"]
        stack = state["stack"]
        value = state["state_value"]
        if len(stack) <= 1:
            event = TraceEvent(step=step, action="Summary", op="noop", content=content, stack_depth=len(stack),
                               state_value=value, detail="nothing to summarise: only the User_Query is on the stack")
            return Command(goto="Generate", update=self._step_update(state, config, stack=stack, event=event))
        frame = self._new_frame(Action.SUMMARY, content, step, state_before=value, state_after=value)
        stack, popped = replace_top(stack, frame)
        event = TraceEvent(step=step, action="Summary", op="pop+push", content=content, stack_depth=len(stack),
                           state_value=value, detail=f"replaced {popped.action.value} ({popped.token_count} tokens)")
        return Command(goto="Generate", update=self._step_update(state, config, stack=stack, event=event))

    def conclusion(self, state: TCRAGState, config: RunnableConfig, runtime: Runtime) -> Command[
        Literal["Generate", "Human_Review", "__end__"]
    ]:
        cfg = self.cfg(config, runtime)
        content = state["pending_action"]["content"]
        step = state.get("steps", 0) + 1
        before = state["state_value"]
        sigma = state["sigma"]
        if not cfg.enable_state_monitor:
            frame = self._new_frame(Action.CONCLUSION, content, step, state_before=before, state_after=before)
            stack = push(state["stack"], frame)
            event = TraceEvent(step=step, action="Conclusion", op="push", content=content, stack_depth=len(stack),
                               state_value=before, detail="state monitor off: accepted as written")
            update = self._step_update(state, config, stack=stack, event=event)
            return self.halt({**state, **update}, config, reason="conclusion_unmonitored", answer=content,
                             validated=False, extra=update)
        try:
            f = self.score(state["question"], content, cfg.metric)
        except Exception as exc:
            return self.halt(state, config, reason="scorer_error", answer=None, validated=False,
                             error=f"{type(exc).__name__}: {exc}")
        if f < sigma:
            frame = self._new_frame(Action.CONCLUSION, content, step, state_before=before, state_after=f)
            stack = push(state["stack"], frame)
            event = TraceEvent(step=step, action="Conclusion", op="push", content=content, stack_depth=len(stack),
                               state_value=f, detail=f"accepted: {f:.4g} < sigma {sigma:g}")
            update = self._step_update(state, config, stack=stack, event=event, state_value=f, history_value=f)
            if cfg.require_review:
                return Command(goto="Human_Review", update=update)
            return self.halt({**state, **update}, config, reason="validated", answer=content, validated=True,
                             extra=update)
        # Rejected: the Conclusion becomes a Thought and its value the state (Algorithm 1, line 12).
        frame = self._new_frame(Action.THOUGHT, content, step, state_before=before, state_after=f)
        stack = push(state["stack"], frame)
        event = TraceEvent(step=step, action="Conclusion", op="reject", content=content, stack_depth=len(stack),
                           state_value=f, detail=f"rejected: {f:.4g} >= sigma {sigma:g}; kept as a Thought")
        return Command(goto="Generate", update=self._step_update(
            state, config, stack=stack, event=event, state_value=f, history_value=f))

    def human_review(self, state: TCRAGState, config: RunnableConfig) -> Command[Literal["Generate", "__end__"]]:
        top = state["stack"][-1]
        decision = interrupt({
            "question": state["question"], "answer": top.content,
            "state_value": state["state_value"], "sigma": state["sigma"],
            "instructions": "Resume with Command(resume='approve') or Command(resume={'approve': False, 'feedback': '...'})",
        })
        approved, feedback = _review_decision(decision)
        if approved:
            return self.halt(state, config, reason="validated", answer=top.content, validated=True)
        stack, popped = pop(state["stack"])
        value = max(state["state_value"], state["sigma"])
        note = popped.content if not feedback else f"{popped.content}\n(Reviewer rejected this: {feedback})"
        frame = self._new_frame(Action.THOUGHT, note, popped.step, state_before=popped.state_before, state_after=value)
        stack = push(stack, frame)
        event = TraceEvent(step=state["steps"], action="Human_Review", op="reject", content=note,
                           stack_depth=len(stack), state_value=value, detail="rejected by the human reviewer")
        return Command(goto="Generate", update={"stack": stack, "state_value": value,
                                                "trace": self.record(state, config, event)})


def _review_decision(decision: Any) -> tuple[bool, Optional[str]]:
    if isinstance(decision, bool):
        return decision, None
    if isinstance(decision, str):
        return decision.strip().lower() in {"approve", "approved", "accept", "yes", "y", "ok"}, None
    if isinstance(decision, dict):
        return bool(decision.get("approve", False)), decision.get("feedback")
    return False, f"unrecognised review decision {decision!r}"


def _child_config(config: RunnableConfig) -> dict[str, Any]:
    keep = ("callbacks", "tags", "metadata", "run_name", "max_concurrency")
    child = {k: config[k] for k in keep if config and k in config}
    child["configurable"] = {k: v for k, v in (config or {}).get("configurable", {}).items() if not k.startswith("__")}
    return child


_ANSWER_FRAMES = (Action.CONCLUSION, Action.THOUGHT, Action.SUMMARY)


def _unverified_answer(stack: list[Frame]) -> Optional[str]:
    """The answer of a run that did not validate: the top-most text the model wrote itself
    (Algorithm 1 returns top(M); a tool observation or the question is never an answer)."""
    for frame in reversed(stack[1:]):
        if frame.action in _ANSWER_FRAMES:
            return frame.content
    return None


def _last_human_is(state: TCRAGState, question: str) -> bool:
    for message in reversed(state.get("messages") or []):
        if isinstance(message, HumanMessage):
            return message_text(message.content).strip() == question
    return False


def _extract_question(state: TCRAGState, cfg: TCRAGConfig) -> tuple[str, Optional[str]]:
    """The question and, if it cannot be used, why not."""
    raw: Any = state.get("question")
    messages = state.get("messages") or []
    # A chat turn ends with the user's message; it is newer than a question left from the last turn.
    if messages and isinstance(messages[-1], HumanMessage):
        raw = messages[-1].content
        if isinstance(raw, list):
            raw = message_text(raw)
    if raw is None:
        return "", "no question: give {'question': ...} or {'messages': [...]} ending with a human message"
    return question_problem(raw, cfg)


def question_problem(raw: Any, cfg: TCRAGConfig) -> tuple[str, Optional[str]]:
    """``(cleaned question, None)``, or ``("", why it cannot be used)``."""
    if not isinstance(raw, str):
        return "", f"the question must be text, not {type(raw).__name__}"
    question = _CONTROL.sub(" ", raw).strip()
    if not question:
        return "", "the question is empty"
    if len(question) > cfg.max_question_chars:
        return "", (f"the question is {len(question):,} characters long; the limit is {cfg.max_question_chars:,} "
                    "(raise max_question_chars, or shorten it)")
    if not any(ch.isalnum() for ch in question):
        return "", "the question contains no readable text"
    return question, None


def build_graph(
    *,
    model: Optional[BaseChatModel] = None,
    tools: Optional[Sequence[BaseTool]] = None,
    scorer: Optional[StateScorer | Callable[..., float]] = None,
    config: Optional[TCRAGConfig | dict[str, Any]] = None,
    checkpointer: Any = None,
    store: Any = None,
    name: str = "tcrag",
):
    """Build and compile the TC-RAG graph.

    Args:
        model: any LangChain chat model; ``None`` uses the packaged SmolLM2-135M-Instruct.
        tools: LangChain tools the agent may call (names must be unique); none by default.
        scorer: the state monitor (``score(query, text, *, metric) -> float``); ``None`` uses the
            local causal LM (the packaged model, shared with the default generator).
        config: :class:`TCRAGConfig` (or a dict of its fields); overridable per run through
            ``context=`` or ``config["configurable"]``.
        checkpointer: a LangGraph checkpointer (e.g. ``SqliteSaver``) for durable, resumable runs;
            give it ``serde=tcrag_langgraph.checkpoint_serde()`` so the typed frames restore without
            "unregistered type" warnings.

    Returns:
        A compiled graph: ``invoke({"question": ...})`` or ``invoke({"messages": [...]})``.
    """
    cfg = config if isinstance(config, TCRAGConfig) else TCRAGConfig.model_validate(config or {})
    tools = list(tools or [])
    for tool in tools:
        if not isinstance(tool, BaseTool):
            raise TypeError(f"tools must be LangChain BaseTool instances, got {type(tool).__name__}")
    if model is not None and not isinstance(model, BaseChatModel):
        raise TypeError(f"model must be a LangChain chat model (BaseChatModel), got {type(model).__name__}")
    machine = _Machine(model, tools, scorer, cfg)
    builder = StateGraph(TCRAGState, context_schema=TCRAGConfig)
    builder.add_node("Start", machine.start)
    builder.add_node("Generate", machine.generate)
    builder.add_node("Thought", machine.thought)
    builder.add_node("Plan", machine.plan)
    builder.add_node("Tool_Use", machine.tool_use)
    builder.add_node("Summary", machine.summary)
    builder.add_node("Backtrack", machine.backtrack)
    builder.add_node("Conclusion", machine.conclusion)
    builder.add_node("Human_Review", machine.human_review)
    builder.add_edge(START, "Start")
    graph = builder.compile(checkpointer=checkpointer, store=store, name=name)
    graph.tcrag_config = cfg  # type: ignore[attr-defined]
    graph.tcrag_tools = tools  # type: ignore[attr-defined]
    return graph
