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

Why one module of this size: every node is a short adapter over one ``TCRAG`` (score, apply a rule
of :mod:`.transitions`, emit); the rules themselves live in :mod:`.transitions`.
"""

from __future__ import annotations

import json
import os
import re
from typing import Any, Callable, Literal, Mapping, Optional, Sequence

from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, SystemMessage
from langchain_core.runnables import RunnableConfig
from langchain_core.tools import BaseTool
from langgraph.runtime import Runtime
from langgraph.types import Command, interrupt

from ...core import answer_format
from ...core.arguments import BuildArguments
from ...core.config import TCRAGConfig
from ...core.events import EVENT_NAME
from ...core.kernel import RunFailure, RunKernel
from ...core.run_input import extract_question, last_human_is, question_problem
from ...core.state import Action, Frame, TraceEvent, observations
from ...models.local import chat_model_id
from ...monitor.calibration import confidence_map, resolve_monitor, resolve_sigma, risk_sigma, stored_combination
from ...monitor.consistency import SamplingConsistencyScorer
from ...monitor.generation import GENERATION_VALUES, NoGenerationLogprobs, returns_logprobs
from ...monitor.own_model import has_own_monitor, scores_own_weights
from ...monitor.scoring import StateScorer
from ...monitor.state_values import SAMPLED_VALUES, uses_evidence
from ...tools.tokens import count_tokens
from . import transitions
from .actions import ActionParseError, format_instructions, parse_action
from .prompting import demonstrations, final_turn_text, rejected_note, repeated_call_note, system_prompt, turn_text
from .reply_forms import action_form
from .state import ParsedAction, TCRAGState, render_stack
from .transitions import HaltReason, Machine, Transition

__all__ = ["TCRAG", "build_graph", "question_problem", "EVENT_NAME", "NODE_NAMES", "HALT_REASONS"]

NODE_NAMES = ("Start", "Generate", "Thought", "Plan", "Tool_Use", "Summary", "Backtrack", "Conclusion", "Human_Review")
HALT_REASONS = tuple(reason.value for reason in HaltReason)
# Generation stops before the model invents a tool result or a new turn, and at the next action
# label after a blank line: one reply holds one action, and a small model does not spend its token
# budget writing an imagined run (benchmarks/main_job.py). The labels need the blank line because
# the local model's stop check also reads the prompt's last newline: "\nThought:" would end every
# reply that starts with "Thought:". Not "Conclusion:": "Thought: ...\nConclusion: ..." is the
# paper's own way to conclude, and the parser takes that Conclusion. Further actions after a single
# newline are left to the parser (it uses the first).
STOP_SEQUENCES = ["\nTool_Observation:", "\nObservation:", "\nTool_Error:", "\nUser_Query:", "\nBegin!",
                  "\nWrite your next action", "\n\nThought:", "\n\nPlan:", "\n\nTool_Use:", "\n\nSummary:",
                  "\n\nBacktrack:"]


class TCRAG(RunKernel):
    """TC-RAG's node holder on the run kernel: each node scores or calls what the step needs
    (through the kernel), applies one rule of :mod:`.transitions` and emits its event."""

    method = "TC-RAG"
    default_name = "tcrag"
    state_schema = TCRAGState
    context_schema = TCRAGConfig
    nodes = {name: name.lower() for name in NODE_NAMES}
    #: with ``risk``: the sigma the stored calibration certified when the graph was built
    certified_sigma: Optional[float] = None

    @classmethod
    def prepare(cls, args: BuildArguments) -> "TCRAG":
        """``sigma="auto"`` resolved once, from the generator's stored calibration (a missing one fails
        here, not mid-run); the monitor scores with the generator's own weights unless a scorer is given,
        never silently with another model."""
        cfg = monitor_config(args.config, args.model, args.scorer)
        if cfg.enable_state_monitor and cfg.metric in SAMPLED_VALUES and not callable(getattr(args.scorer, "samples", None)):
            scorer = SamplingConsistencyScorer(args.model)  # a log-prob scorer (eval's shared one) cannot sample
        else:  # the generation values need no scorer: the replies carry their log-probs
            scorer = cls.scorer_for(args, needed=cfg.enable_state_monitor and cfg.metric not in GENERATION_VALUES)
        machine = cls(args.model, args.tools, scorer, cfg, trust_client_identity=args.trust_client_identity)
        # what the shipped calibration says of this model as its own monitor (also an evaluation's shared
        # scorer over the same weights: tcrag eval measures what tcrag ask does)
        if scorer is not None and (args.scorer is None or scores_own_weights(args.scorer, args.model)):
            machine.unjudged = _unjudged(args.model)
        if cfg.enable_state_monitor and cfg.risk is not None:  # the calibration must exist now, not mid-run
            machine.certified_sigma, why = risk_sigma(cfg, chat_model_id(args.model))
            if why is not None:  # nothing may be validated: the run says why
                machine.unjudged = {**machine.unjudged, cfg.metric: why}
        if cfg.enable_state_monitor and cfg.metric == "gen_combined":  # the fit it reads, now, not mid-run
            machine.combination = stored_combination(cfg, chat_model_id(args.model))
        if cfg.enable_state_monitor:
            try:
                machine.confidence_map = confidence_map(cfg, chat_model_id(args.model))
            except ValueError:  # a model without a name has no stored calibration
                machine.confidence_map = None
        return machine

    def sigma(self, cfg: TCRAGConfig) -> float:
        """sigma as a number: the given one or the paper's; ``"auto"`` this generator's stored
        calibration (tcrag calibrate); with ``risk``, the threshold its stored answers certify."""
        if cfg.risk is not None and cfg.enable_state_monitor:  # a run without the monitor judges nothing
            if self.certified_sigma is not None:  # certified once when the graph was built (a run cannot change risk)
                return self.certified_sigma
            return risk_sigma(cfg, chat_model_id(self.model))[0]  # built with the monitor off, a run turns it on
        if cfg.sigma != "auto":
            return cfg.effective_sigma
        return resolve_sigma(cfg, chat_model_id(self.model))

    def option_problem(self, options: Mapping[str, Any]) -> Optional[str]:
        """``sigma="auto"`` asked per request needs this model's stored calibration: say so before the run."""
        if options.get("sigma") != "auto" or not self.base_config.enable_state_monitor:
            return None
        try:
            self.sigma(self.base_config.merged({k: v for k, v in options.items() if k in TCRAGConfig.model_fields}))
        except (ValueError, FileNotFoundError) as exc:
            return f"sigma 'auto': {exc}"
        return None

    def cfg(self, config: RunnableConfig, runtime: Runtime) -> TCRAGConfig:
        return self.settings(config, runtime)[0]

    def apply(self, state: TCRAGState, config: RunnableConfig, t: Transition) -> dict[str, Any]:
        """The state update for transition ``t`` (its event emitted live)."""
        update: dict[str, Any] = {"stack": t.stack, "steps": t.steps, "state_value": t.state_value,
                                  "pending_action": None, "trace": self.record(state.get("trace"), config, t.event)}
        if t.state_set:
            update["state_history"] = [*state.get("state_history", []), {
                "step": t.steps, "action": t.event.action, "value": t.state_value, "raw": t.scored}]
        return update

    def monitor(self, state: TCRAGState, cfg: TCRAGConfig, text: str, *, conclusion: bool,
                usage: Optional[dict[str, int]] = None) -> Optional[float]:
        """The state monitor's value of ``text`` (:mod:`~tcrag_langgraph.monitor.state_values`): given the
        question (the paper's cppl / uct), or the question and the tool observations on the stack;
        ``None`` when the monitor is switched off. ``usage`` is charged the model calls a sampled value
        makes (:meth:`charged` adds them to the run's counters)."""
        if not cfg.enable_state_monitor:
            return None
        if cfg.metric in ("answer_prob", "gen_answer_prob", "gen_combined", *SAMPLED_VALUES):
            if not conclusion:  # a Thought has no answer to weigh or resample: it keeps the state at sigma
                return state["sigma"]
            if cfg.metric == "answer_prob":
                text = answer_format.fit(cfg.answer_format, text)
        if cfg.metric in GENERATION_VALUES:  # read off the reply that wrote the text (Generate kept it)
            value = (state.get("generated_values") or {}).get(cfg.metric)
            if value is None:
                need = " (it needs an answer_format of choices, and the answer among them)" \
                    if cfg.metric in ("gen_answer_prob", "gen_combined") else ""
                raise RunFailure("scorer_error", f"no {cfg.metric} for this reply{need}")
            return value
        evidence = observations(state["stack"]) if uses_evidence(cfg.metric) else ()
        return self.state_value(cfg.metric, state["question"], text, evidence=evidence, choices=cfg.answer_format,
                                usage=usage)

    @staticmethod
    def charged(state: TCRAGState, spent: Mapping[str, int]) -> dict[str, Any]:
        """The run's counters with the monitor's own model calls added (``consistency``'s samples): a run
        reports everything it asked the model."""
        if not spent.get("llm_calls"):
            return {}
        usage = dict(state.get("token_usage") or {"prompt": 0, "completion": 0})
        usage["prompt"] = usage.get("prompt", 0) + spent.get("prompt", 0)
        usage["completion"] = usage.get("completion", 0) + spent.get("completion", 0)
        return {"llm_calls": state.get("llm_calls", 0) + spent["llm_calls"], "token_usage": usage}

    def halt(self, state: Mapping[str, Any], config: Optional[RunnableConfig], **kwargs: Any) -> Command:
        """The kernel's halt; the stack machine also drops its pending action."""
        kwargs["extra"] = {**(kwargs.get("extra") or {}), "pending_action": None}
        return super().halt(state, config, **kwargs)

    # ----- nodes -----
    def start(self, state: TCRAGState, config: RunnableConfig, runtime: Runtime) -> Command[Literal["Generate", "__end__"]]:
        cfg = self.cfg(config, runtime)
        base = {
            "stack": [], "trace": [], "steps": 0, "llm_calls": 0, "format_retries": 0, "format_feedback": [],
            "state_history": [], "answer": None, "answer_validated": False, "halt_reason": None, "error": None,
            "sigma": None, "metric": cfg.metric, "state_value": cfg.initial_state_value,
            "token_usage": {"prompt": 0, "completion": 0}, "tool_calls": 0, "pending_action": None,
            "structured_answer": None, "final_conclusion": False, "repeated_tool_calls": 0, "last_call": False,
            "repeat_warned": None, "repeat_call_warned": False, "search_ended": False, "generated_values": {},
            "answer_generation_values": {}, "records_read": [],
        }
        question, problem = extract_question(state, cfg)
        if problem is None and (cfg.risk, cfg.risk_delta) != (self.base_config.risk, self.base_config.risk_delta):
            problem = "risk and risk_delta are set when the graph is built (its calibration is checked then)"
        if problem is None:
            try:
                base["sigma"] = self.sigma(cfg)
            except (ValueError, FileNotFoundError) as exc:  # "auto" or risk with no calibration for this model
                problem = str(exc)
        if problem is not None:
            # The question of an earlier turn on this thread must not look like this run's.
            return self.halt({**state, **base}, config, reason=HaltReason.INVALID_INPUT, answer=None,
                             validated=False, error=problem, extra={**base, "question": None})
        t = transitions.start(question, initial_state_value=cfg.initial_state_value, sigma=base["sigma"])
        update = {**base, "question": question, "stack": t.stack,
                  "trace": self.record([], config, t.event)}
        if not last_human_is(state, question):
            update["messages"] = [HumanMessage(content=question)]
        return Command(goto="Generate", update=update)

    def generate(self, state: TCRAGState, config: RunnableConfig, runtime: Runtime) -> Command[
        Literal["Thought", "Plan", "Tool_Use", "Summary", "Backtrack", "Conclusion", "Generate", "__end__"]
    ]:
        cfg = self.cfg(config, runtime)
        stack = state["stack"]
        steps = state.get("steps", 0)
        # budget spent, or no usable action after the re-prompts: one last Conclusion is asked for, then scored
        final = steps >= cfg.max_steps or bool(state.get("last_call")) or bool(state.get("search_ended"))
        allowed = ["Conclusion"] if final else cfg.allowed_actions(has_tools=bool(self.tools))
        # a rejected Conclusion stands until new evidence, a Backtrack or a Summary answers it
        rejected = None if final else transitions.unanswered_rejection(state.get("trace", []))
        tools = list(self.tools.values())
        answer_rule = answer_format.instructions(cfg.answer_format)
        offered = cfg.allowed_actions(has_tools=bool(self.tools))
        messages: list[BaseMessage] = [SystemMessage(content=system_prompt(tools, offered, language=cfg.language))]
        if cfg.few_shot:
            for shown, reply in demonstrations(tools, offered, language=cfg.language,
                                               with_observation=cfg.conclusion_example_from_observation()):
                messages += [HumanMessage(content=shown), AIMessage(content=reply)]
        rendered = render_stack(stack)
        why = ("The search has ended: a tool call whose result is above was written again."
               if state.get("search_ended") else "No steps are left.")
        turn = (final_turn_text(rendered, answer_rule=answer_rule, why=why) if final
                else turn_text(rendered, steps_left=cfg.max_steps - steps, answer_rule=answer_rule,
                               rejected=rejected_note(rejected, transitions.ways_after_rejection(allowed), list(self.tools))
                               if rejected is not None else ""))
        prefix = len(messages)
        messages.append(HumanMessage(content=turn))
        for item in state.get("format_feedback", []):
            messages += [AIMessage(content=item["output"]), HumanMessage(content=item["error"])]
        # where the prompt's tokens go (tcrag summarize): the fixed prefix, the stack, the re-prompts
        sizes = [count_tokens(str(m.content)) for m in messages]
        parts = {"prefix": sum(sizes[:prefix]), "stack": sizes[prefix], "reprompt": sum(sizes[prefix + 1:])}
        work = self.counters(state)
        read_logprobs = cfg.metric in GENERATION_VALUES or cfg.record_generation_values
        text = self.ask(work, messages, cfg, config, stop=STOP_SEQUENCES,  # a failure halts: model_error
                        logprobs=read_logprobs, prompt_parts=parts,
                        form=action_form(allowed, tools, cfg.answer_format))  # one action line, where constrained
        common = {"llm_calls": work["llm_calls"], "token_usage": work["token_usage"]}
        try:
            if final:
                parsed = _final_conclusion(text, list(self.tools))
            else:
                parsed = parse_action(text, list(self.tools), allowed=allowed,
                                      unlabeled_as="Thought" if cfg.unlabeled_text == "thought" else None)
            if parsed.action is Action.CONCLUSION:
                problem = answer_format.problem(cfg.answer_format, parsed.content)
                if problem is not None:
                    raise ActionParseError(f"your Conclusion does not fit the required answer: {problem}")
                repeat = self.unanswered_repeat(state, cfg, parsed.content, rejected)
                if repeat is not None:  # told once what to do instead; a second repeat halts (Conclusion node)
                    ways = transitions.ways_after_rejection(allowed)
                    note = (f"You wrote again the Conclusion the state monitor rejected at step {repeat.step}: it is "
                            "not supported by what is on the stack. Do not write it again. "
                            + format_instructions(ways, list(self.tools)))
                    trace = self.record(state.get("trace"), config, TraceEvent(
                        step=steps, action="Format_Error", op="format_error", content=text[:500],
                        stack_depth=len(stack), state_value=state.get("state_value"), detail=note))
                    feedback = [*state.get("format_feedback", []), {"output": text[:2000], "error": note}]
                    common["token_usage"] = _spent_on(common["token_usage"], "completion_rejected", text)
                    return Command(goto="Generate", update={**common, "trace": trace, "format_feedback": feedback,
                                                              "repeat_warned": repeat.step})
        except ActionParseError as err:
            common["token_usage"] = _spent_on(common["token_usage"], "completion_unusable", text)
            retries = state.get("format_retries", 0) + 1
            trace = self.record(state.get("trace"), config, TraceEvent(
                step=steps, action="Format_Error", op="format_error", content=text[:500],
                stack_depth=len(stack), state_value=state.get("state_value"), detail=str(err)))
            if retries <= cfg.max_format_retries:
                feedback = [*state.get("format_feedback", []), {
                    "output": text[:2000] or "(empty)",
                    "error": f"Your reply could not be used: {err}.\n"
                             + format_instructions(allowed, list(self.tools)) + (f"\n{answer_rule}" if answer_rule else ""),
                }]
                return Command(goto="Generate", update={**common, "trace": trace, "format_retries": retries,
                                                          "format_feedback": feedback})
            extra = {**common, "trace": trace, "format_retries": retries}
            if not final:  # like a spent budget: the model still gets to write its Conclusion
                return Command(goto="Generate", update={**extra, "format_retries": 0, "format_feedback": [],
                                                          "last_call": True})
            if state.get("last_call"):
                return self.halt(state, config, reason=HaltReason.FORMAT_ERROR,
                                 answer=transitions.unverified_answer(stack), validated=False,
                                 error=f"no usable action, nor a usable final Conclusion, after the re-prompts: {err}",
                                 extra=extra)
            return self.halt(state, config, reason=HaltReason.MAX_STEPS,
                             answer=transitions.unverified_answer(stack), validated=False,
                             error=f"step budget of {cfg.max_steps} actions spent and no usable final "
                                   f"Conclusion: {err}", extra=extra)
        generated = (self.generated_values(work.get("generated_tokens"), parsed, cfg, common)
                     if read_logprobs else {})
        return Command(goto=parsed.action.value,
                       update={**common, "pending_action": parsed, "format_retries": 0, "format_feedback": [],
                               "final_conclusion": final, "generated_values": generated})

    def generated_values(self, tokens: Any, parsed: ParsedAction, cfg: TCRAGConfig,
                         common: dict[str, Any]) -> dict[str, float]:
        """The generation values of a Thought's or Conclusion's text (:mod:`~tcrag_langgraph.monitor.generation`),
        from the reply's own token log-probs; a monitor that reads them from a reply without any halts
        with ``scorer_error`` saying so."""
        if parsed.action not in (Action.CONCLUSION, Action.THOUGHT):
            return {}
        try:
            return self.generation_values_of({"generated_tokens": tokens}, parsed.content, cfg,
                                             answer=parsed.action is Action.CONCLUSION)
        except NoGenerationLogprobs as exc:
            if cfg.enable_state_monitor and cfg.metric in GENERATION_VALUES:
                raise RunFailure("scorer_error", f"{exc}: {cfg.metric} reads them (a server that returns none: "
                                 "use metric 'consistency')", update=common) from None
            return {}

    def unanswered_repeat(self, state: TCRAGState, cfg: TCRAGConfig, content: str,
                          rejected: Optional[TraceEvent]) -> Optional[TraceEvent]:
        """The rejection a Conclusion repeats while nothing has answered it, if the model has not been
        told yet to leave that Conclusion (None: score it, or halt it as repeated in the Conclusion node)."""
        if rejected is None or not cfg.enable_state_monitor:
            return None
        earlier = transitions.rejected_conclusion(state.get("trace", []), content, latest=True)
        if earlier is None or state.get("repeat_warned") == earlier.step:
            return None
        return earlier

    @staticmethod
    def machine(state: TCRAGState) -> Machine:
        return Machine(stack=state["stack"], state_value=state["state_value"], sigma=state["sigma"],
                       steps=state.get("steps", 0))

    def thought(self, state: TCRAGState, config: RunnableConfig, runtime: Runtime) -> Command[Literal["Generate", "__end__"]]:
        cfg = self.cfg(config, runtime)
        content = state["pending_action"].content
        spent: dict[str, int] = {}
        score = self.monitor(state, cfg, content, conclusion=False, usage=spent)  # a failure halts: scorer_error
        t = transitions.thought(self.machine(state), content, score=score)
        return Command(goto="Generate", update={**self.apply(state, config, t), **self.charged(state, spent)})

    def plan(self, state: TCRAGState, config: RunnableConfig) -> Command[Literal["Generate"]]:
        t = transitions.plan(self.machine(state), state["pending_action"].content)
        return Command(goto="Generate", update=self.apply(state, config, t))

    def tool_use(self, state: TCRAGState, config: RunnableConfig, runtime: Runtime) -> Command[Literal["Generate"]]:
        cfg = self.cfg(config, runtime)
        pending = state["pending_action"]
        tool = self.tools[pending.tool]
        tool_input = pending.tool_input
        if tool_input is None or tool_input == "":
            tool_input = state["question"]  # the paper's Tool_Use names only the tool: search the query
        earlier = transitions.repeated_call(state["stack"], tool.name, tool_input)
        if earlier is not None:  # the result is on the stack already: running it again cannot help
            return self.refuse_repeated_call(state, config, cfg, tool.name, tool_input, earlier)
        work = self.counters(state)
        # what the run has read goes with the call (the kernel's): outbound tools refuse (tools/layer/egress.py)
        record = self.call_tool(work, tool, tool_input, cfg, config)
        detail = json.dumps({"tool": tool.name, "input": tool_input, "error": record.error_kind},
                            ensure_ascii=False, default=str)
        t = transitions.tool_use(self.machine(state), record, content=pending.content, detail=detail)
        update = self.apply(state, config, t)
        update["tool_calls"] = work["tool_calls"]
        return Command(goto="Generate", update=update)

    def refuse_repeated_call(self, state: TCRAGState, config: RunnableConfig, cfg: TCRAGConfig, tool: str,
                             tool_input: Any, earlier: Frame) -> Command:
        """A call whose result is on the stack is not run and pushes nothing. While a rejected Conclusion
        stands unanswered, the repeat says the model has nothing new to look for: the run halts
        ``repeated_call`` with that Conclusion as its unvalidated answer (Algorithm 1's top(M), as at the
        budget, without spending it). Otherwise, the first time, the model is told where the result is
        and what to do instead (as a re-prompt, like a format error); the second time the search ends:
        one final Conclusion is asked for and scored. Pushing the refusal as a frame (before) made the
        1.5B copy the call again, up to five times in a row, and Backtrack the refusal
        (benchmarks/RESULTS.md section 21)."""
        stands = transitions.unanswered_rejection(state.get("trace", []))
        ended = bool(state.get("repeat_call_warned")) or stands is not None
        written = f"Tool_Use: {tool}\nTool_Input: {tool_input if isinstance(tool_input, str) else json.dumps(tool_input)}"
        trace = self.record(state.get("trace"), config, TraceEvent(
            step=state.get("steps", 0), action="Tool_Use", op="format_error", content=written[:500],
            stack_depth=len(state["stack"]), state_value=state.get("state_value"),
            detail=json.dumps({"tool": tool, "input": tool_input, "error": "repeated_call",
                               "earlier_step": earlier.step, "search_ended": ended}, ensure_ascii=False, default=str)))
        update: dict[str, Any] = {
            "trace": trace, "pending_action": None,
            "repeated_tool_calls": state.get("repeated_tool_calls", 0) + 1,
            "token_usage": _spent_on(state.get("token_usage"), "completion_refused_repeat", written)}
        if stands is not None:
            answer = transitions.unverified_answer(state["stack"])
            update["structured_answer"] = answer_format.fit(cfg.answer_format, answer or "")
            return self.halt({**state, **update}, config, reason=HaltReason.REPEATED_CALL, answer=answer,
                             validated=False, extra=update,
                             error=(f"the state monitor rejected the Conclusion of step {stands.step} and the model "
                                    "then wrote again a tool call whose result was on the stack: nothing new to "
                                    "search; not validated"))
        if ended:
            update["search_ended"] = True
        else:
            update.update(repeat_call_warned=True,
                          format_feedback=[{"output": written, "error": repeated_call_note(tool, earlier.step)}])
        return Command(goto="Generate", update=update)

    def backtrack(self, state: TCRAGState, config: RunnableConfig) -> Command[Literal["Generate"]]:
        return Command(goto="Generate", update=self.apply(state, config, transitions.backtrack(self.machine(state))))

    def summary(self, state: TCRAGState, config: RunnableConfig) -> Command[Literal["Generate"]]:
        t = transitions.summary(self.machine(state), state["pending_action"].content)
        return Command(goto="Generate", update=self.apply(state, config, t))

    def conclusion(self, state: TCRAGState, config: RunnableConfig, runtime: Runtime) -> Command[
        Literal["Generate", "Human_Review", "__end__"]
    ]:
        cfg = self.cfg(config, runtime)
        content = state["pending_action"].content
        earlier = (transitions.rejected_conclusion(state.get("trace", []), content)
                   if cfg.enable_state_monitor and not state.get("final_conclusion") else None)
        if earlier is not None and uses_evidence(cfg.metric):
            latest = transitions.rejected_conclusion(state.get("trace", []), content, latest=True)
            if transitions.evidence_since(state.get("trace", []), latest.step):
                earlier = None  # its value depends on the evidence too, and new evidence came: score it again
        if earlier is not None:  # the same text would get the same value: halt instead of looping
            t = transitions.repeated_conclusion(self.machine(state), content, earlier)
            update = self.apply(state, config, t)
            update["structured_answer"] = answer_format.fit(cfg.answer_format, t.answer or "")
            update["answer_generation_values"] = dict(state.get("generated_values") or {})
            return self.halt({**state, **update}, config, reason=t.halt, answer=t.answer, validated=False,
                             error=f"the model wrote again the Conclusion the state monitor rejected at step "
                                   f"{earlier.step}; not validated", extra=update)
        spent: dict[str, int] = {}
        score = self.monitor(state, cfg, content, conclusion=True, usage=spent)  # a failure halts: scorer_error
        unjudged = self.unjudged.get(cfg.metric) if cfg.risk is None and not cfg.loop_when_unjudged else None
        if state.get("final_conclusion"):
            t = transitions.final_conclusion(self.machine(state), content, score=score)
        elif unjudged:
            t = transitions.unjudged_conclusion(self.machine(state), content, score=score)
        elif cfg.max_rejections is not None:
            t = transitions.limited_conclusion(self.machine(state), content, score=score,
                                               rejections=transitions.rejections_so_far(state.get("trace", [])),
                                               max_rejections=cfg.max_rejections)
        else:
            t = transitions.conclusion(self.machine(state), content, score=score)
        if cfg.risk is not None:
            t = transitions.rewritten_conclusion(t, state.get("trace", []))
        update = {**self.apply(state, config, t), **self.charged(state, spent)}
        if t.halt is None:  # rejected: kept as a Thought, the loop goes on
            update["token_usage"] = _spent_on(update.get("token_usage") or state.get("token_usage"),
                                              "completion_rejected", content)
            return Command(goto="Generate", update=update)
        update["structured_answer"] = answer_format.fit(cfg.answer_format, t.answer or "")
        update["answer_generation_values"] = dict(state.get("generated_values") or {})
        if t.halt is HaltReason.VALIDATED and cfg.require_review:
            return Command(goto="Human_Review", update=update)
        reason, error = t.halt, None
        if t.halt is HaltReason.MAX_STEPS and state.get("search_ended"):
            reason = HaltReason.REPEATED_CALL
            error = ("the model wrote again a tool call whose result was on the stack, after being told once; "
                     "the search ended and the final Conclusion was not validated")
        elif t.halt is HaltReason.MAX_STEPS and state.get("last_call"):
            reason = HaltReason.FORMAT_ERROR
            error = "no usable action after the re-prompts; the final Conclusion asked for instead was not validated"
        elif t.halt is HaltReason.MAX_STEPS:
            error = f"step budget of {cfg.max_steps} actions spent; the final Conclusion was not validated"
        elif t.halt is HaltReason.MONITOR_CANNOT_JUDGE:
            error = unjudged
        elif t.halt is HaltReason.REJECTIONS_SPENT:
            error = (f"the state monitor rejected this Conclusion and the run's rejections were spent "
                     f"(max_rejections={cfg.max_rejections}); not validated")
        elif t.halt is HaltReason.REWRITTEN_CONCLUSION:
            error = ("accepted below sigma after the state monitor rejected an earlier Conclusion; the risk's "
                     "calibration speaks for a run's first Conclusion only, so it is not validated")
        return self.halt({**state, **update}, config, reason=reason, answer=t.answer,
                         validated=t.halt is HaltReason.VALIDATED, error=error, extra=update,
                         calibrated=t.halt is not HaltReason.REWRITTEN_CONCLUSION)

    def human_review(self, state: TCRAGState, config: RunnableConfig) -> Command[Literal["Generate", "__end__"]]:
        top = state["stack"][-1]
        decision = interrupt({
            "question": state["question"], "answer": top.content,
            "state_value": state["state_value"], "sigma": state["sigma"],
            "instructions": "Resume with Command(resume='approve') or Command(resume={'approve': False, 'feedback': '...'})",
        })
        approved, feedback = _review_decision(decision)
        if approved:
            return self.halt(state, config, reason=HaltReason.VALIDATED, answer=top.content, validated=True)
        t = transitions.review_reject(self.machine(state), feedback)
        return Command(goto="Generate", update={"stack": t.stack, "state_value": t.state_value,
                                                "trace": self.record(state.get("trace"), config, t.event)})


def monitor_config(config: TCRAGConfig, model: Any, scorer: Any = None) -> TCRAGConfig:
    """The config TC-RAG monitors ``model`` with: ``sigma="auto"`` resolved from its stored calibration;
    and where it has no prompt log-probs this package can trust, no ``scorer`` is given and no state
    value is asked for (no metric, no sigma), instead of a refusal: the log-probs of its own replies
    when it returns them (``gen_answer_prob`` with an answer format of choices, else ``gen_cppl``),
    else what any chat model gives, ``consistency`` (its own resampled answers). The faces show the
    run's header from it."""
    cfg = config
    if cfg.sigma == "auto":
        metric, sigma = resolve_monitor(cfg, chat_model_id(model))
        cfg = cfg.merged({"metric": metric, "sigma": sigma})
    if (cfg.enable_state_monitor and scorer is None and "metric" not in cfg.model_fields_set and cfg.sigma is None
            and not has_own_monitor(model)):
        if returns_logprobs(model):  # the reply's own log-probs: no second pass, no second server
            choices = isinstance(cfg.answer_format, tuple)
            cfg = cfg.merged({"metric": "gen_answer_prob" if choices else "gen_cppl"})
        else:
            cfg = cfg.merged({"metric": "consistency"})
    return cfg


def _final_conclusion(text: str, tool_names: list[str]) -> ParsedAction:
    """The last reply of a run whose budget is spent, read as its Conclusion: a labelled Conclusion,
    else the text of the one action written (a Thought, Plan or Summary), else the plain reply."""
    try:
        parsed = parse_action(text, tool_names, allowed=None, unlabeled_as="Conclusion")
    except ActionParseError:
        plain = " ".join((text or "").split())
        if not plain or re.match(r"(tool_use|tool_input|backtrack)\b", plain, re.IGNORECASE):
            raise  # a call of a tool this run does not have is no answer either
        return ParsedAction(Action.CONCLUSION, content=plain, repairs=("read the unlabeled final reply as the Conclusion",))
    if parsed.action is Action.CONCLUSION:
        return parsed
    if parsed.action is Action.TOOL_USE or not parsed.content:
        raise ActionParseError("no steps are left for tools or backtracking; write 'Conclusion: <answer>'")
    return ParsedAction(Action.CONCLUSION, content=parsed.content,
                        repairs=(*parsed.repairs, f"took the final {parsed.action.value} as the Conclusion"))


def _review_decision(decision: Any) -> tuple[bool, Optional[str]]:
    if isinstance(decision, bool):
        return decision, None
    if isinstance(decision, str):
        return decision.strip().lower() in {"approve", "approved", "accept", "yes", "y", "ok"}, None
    if isinstance(decision, dict):
        return bool(decision.get("approve", False)), decision.get("feedback")
    return False, f"unrecognised review decision {decision!r}"


def _spent_on(usage: Optional[Mapping[str, int]], kind: str, text: str) -> dict[str, int]:
    """``usage`` with the tokens of a reply that was spent on ``kind`` (a rejected Conclusion, a refused
    repeat, an unusable reply) added under ``kind``: the completions a run wasted, for tcrag summarize."""
    usage = dict(usage or {"prompt": 0, "completion": 0})
    usage[kind] = usage.get(kind, 0) + count_tokens(str(text))
    return usage


def _unjudged(model: Any) -> dict[str, str]:
    """metric -> why the monitor cannot judge ``model`` (:func:`~tcrag_langgraph.monitor.calibration.monitor_cannot_judge`)."""
    from ...monitor.calibration import METRICS, monitor_cannot_judge

    try:
        model_id = chat_model_id(model)
    except ValueError:
        return {}
    found = {metric: monitor_cannot_judge(model_id, metric) for metric in METRICS}
    return {metric: note for metric, note in found.items() if note}


def build_graph(
    *,
    model: BaseChatModel | str | os.PathLike[str] | None = None,
    tools: Optional[Sequence[BaseTool]] = None,
    scorer: Optional[StateScorer | Callable[..., float]] = None,
    config: Optional[TCRAGConfig | dict[str, Any]] = None,
    options: Any = None,
    checkpointer: Any = None,
    store: Any = None,
    name: str = "tcrag",
    trust_client_identity: bool = False,
    model_kwargs: Optional[Mapping[str, Any]] = None,
):
    """Build and compile the TC-RAG graph.

    Args:
        model: any LangChain chat model; a path to a transformers folder or a ``.gguf`` file (a local
            model, converted once and cached); a ``"provider:model"`` name for LangChain's
            ``init_chat_model`` (e.g. ``"openai:NAME"`` for a vLLM server); ``None`` uses the
            packaged SmolLM2-135M-Instruct. See :func:`tcrag_langgraph.models.resolve.resolve_chat_model`.
        tools: LangChain tools the agent may call (names must be unique); none by default.
        scorer: the state monitor (``score(query, text, *, metric) -> float``). ``None`` scores with
            the generator's own weights (:func:`tcrag_langgraph.monitor.own_model.scorer_for_model`: local and
            langchain-huggingface models); for any other model it raises
            :class:`~tcrag_langgraph.monitor.scoring.MonitorUnavailableError` naming the options (pass a
            scorer, or ``TCRAGConfig(enable_state_monitor=False)``).
        config: :class:`TCRAGConfig` (or a dict of its fields); overridable per run through
            ``context=`` or ``config["configurable"]``.
        options: TC-RAG has no options of its own beyond :class:`TCRAGConfig` (the argument exists so
            every method's builder has the same signature); anything but None is a ValueError.
        checkpointer: a LangGraph checkpointer (e.g. ``SqliteSaver``) for durable, resumable runs.
            Give it ``serde=tcrag_langgraph.checkpoint_serde()``: that serializer restores only
            TC-RAG's own state types and LangGraph's, so a tampered checkpoint database cannot make
            it construct arbitrary objects (LangGraph's default serializer executed code from one).
        trust_client_identity: let a run's ``context`` / ``configurable`` set ``caller`` (the
            identity handed to tools such as EMR_SEARCH). Off by default: those are written by the
            client. Turn it on only in-process, when your own code builds the context.
        model_kwargs: keywords for the chat model a ``"provider:model"`` name makes (LangChain's
            ``init_chat_model``), e.g. ``{"base_url": "http://127.0.0.1:8000/v1", "api_key": key}`` for a
            vLLM server; every method's builder takes them the same way.

    Returns:
        A compiled graph: ``invoke({"question": ...})`` or ``invoke({"messages": [...]})``.
    """
    return TCRAG.build(model=model, tools=tools, scorer=scorer, config=config, options=options, checkpointer=checkpointer,
                       store=store, name=name, trust_client_identity=trust_client_identity, model_kwargs=model_kwargs)
