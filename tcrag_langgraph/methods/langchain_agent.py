"""The peer row: LangChain's own agent (``langchain.agents.create_agent``) on the same model, tools,
questions and answer format as every other method, so ``tcrag eval`` shows what TC-RAG costs and
buys against the tool-calling agent a LangChain user would otherwise write.

One node, ``Agent``: ``create_agent(model, tools, system_prompt=...)`` answers the question, the
model calling the tools natively (``bind_tools``; the local models write calls through their chat
template, :mod:`tcrag_langgraph.models.chat_turns`) until it writes a reply without a call. That
reply is the answer, read like CoT's (the last ``Answer:`` line if it has one, else the whole reply)
and checked against ``answer_format``; one out of format is re-prompted in the same conversation
(the agent runs again with the rule), up to ``max_format_retries`` times. The run ends through the
kernel's halt, so the evaluation reads the same result as for every method. There is no state
monitor: an answer is never validated (``halt_reason="answered"``).

The agent loop, its prompt around the calls and when it stops are LangChain's. The kernel comes in
through two of LangChain's own middleware hooks:

* ``wrap_tool_call``: every call the agent makes is answered by :meth:`RunKernel.call_tool` (the
  agent's ToolNode never runs a tool itself), so the peer gets the one tool layer's retries, format
  repair, deadline, trimming, caller identity and egress rule like every method; a failed call comes
  back to the model as an error ToolMessage (``status="error"``), a call of an unknown tool too.
  Calls the model makes at once are run one after another (the run's counters are shared).
* ``wrap_model_call``: every model call is counted as :meth:`RunKernel.ask` counts its calls, by
  :mod:`tcrag_langgraph.core.usage`'s rule, which eval's UsageMeter applies to every method too:
  ``llm_calls``; ``token_usage["prompt"]``: the cl100k tokens of the messages shown (system prompt,
  question, earlier calls and results) plus the bound tools' schemas (a stack machine pays for its
  tool descriptions as prompt text); ``token_usage["completion"]``: the reply, its calls written as
  JSON. ``steps`` is the number of model calls. A local model gets the run's ``max_new_tokens`` and
  ``temperature`` (a provider model keeps its own, as with ``ask``); a failing call halts the run with
  ``model_error``.

Bounds: at most ``max_steps`` model calls per agent run (LangChain's ``ModelCallLimitMiddleware``); a
run that needs more halts ``max_steps`` without an answer (its last message was a tool call).

Example:
    >>> from tcrag_langgraph.testing import scripted_tool, tool_call_reply, tool_calling_model
    >>> model = tool_calling_model([tool_call_reply("DOC_RAG", query="scurvy"), "Vitamin C."])
    >>> graph = LangChainAgent.build(model=model, tools=[scripted_tool("DOC_RAG", "Vitamin C treats {input}.")])
    >>> out = graph.invoke({"question": "What treats scurvy?"})
    >>> out["answer"], out["llm_calls"], out["tool_calls"], out["knowledge"][0]["text"]
    ('Vitamin C.', 2, 1, 'Vitamin C treats scurvy.')
"""

from __future__ import annotations

import json
import threading
from typing import Any, Callable, Literal

from langchain.agents import create_agent
from langchain.agents.middleware import ModelCallLimitMiddleware, wrap_model_call, wrap_tool_call
from langchain.agents.middleware.model_call_limit import ModelCallLimitExceededError
from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, HumanMessage, ToolMessage
from langchain_core.runnables import RunnableConfig
from langgraph.errors import GraphBubbleUp
from langgraph.runtime import Runtime
from langgraph.types import Command

from ..core import answer_format
from ..core.arguments import BuildArguments
from ..core.config import TCRAGConfig
from ..core.kernel import RunFailure, RunKernel, fresh_run
from ..core.run_input import child_config
from ..core.state import MethodState, TraceEvent
from ..core.usage import message_tokens, tools_tokens
from ..models.chat_turns import tool_schemas
from ..models.local import takes_generation_settings
from ..tools.layer.outcome import content_text

__all__ = ["LangChainAgent", "LangChainAgentState", "SYSTEM_PROMPT"]

SYSTEM_PROMPT = ("You are a medical expert. Call the tools to look up what you need, then answer the "
                 "question directly and briefly.")
#: what the answer-format rule calls the answer (the agent has no Conclusion action)
ANSWER_SUBJECT = "Your final answer"


class LangChainAgentState(MethodState, total=False):
    raw_output: str


class LangChainAgent(RunKernel):
    """LangChain's ``create_agent`` on the question, its tool calls through the kernel (module docstring)."""

    method = "LangChain agent"
    default_name = "langchain-agent"
    state_schema = LangChainAgentState
    context_schema = TCRAGConfig
    nodes = {"Start": "start", "Agent": "agent"}

    @classmethod
    def prepare(cls, args: BuildArguments) -> "LangChainAgent":
        """The node holder, once the model is known to call tools (``bind_tools``): a ValueError otherwise."""
        holder = super().prepare(args)
        try:
            args.model.bind_tools(list(holder.tools.values()))
        except NotImplementedError:
            raise ValueError(
                f"{cls.method} needs a chat model with tool calling (bind_tools), and {type(args.model).__name__} "
                "has none: give a local model (a .gguf file or model folder), a provider model such as "
                "'openai:NAME', or leave langchain-agent out of --method") from None
        return holder

    def start(self, state: LangChainAgentState, config: RunnableConfig, runtime: Runtime) -> Command[
        Literal["Agent", "__end__"]
    ]:
        cfg, _ = self.settings(config, runtime)
        return self.begin(state, config, cfg, goto="Agent", fresh=fresh_run(raw_output=""))

    def agent(self, state: LangChainAgentState, config: RunnableConfig, runtime: Runtime,
              work: dict[str, Any]) -> Command[Literal["__end__"]]:
        cfg, _ = self.settings(config, runtime)
        work.update(self.counters(state), knowledge=[])
        fmt = cfg.answer_format
        rule = answer_format.instructions(fmt, subject=ANSWER_SUBJECT)
        # built per run: the system prompt carries this run's answer format, the middleware its counters
        agent = create_agent(
            self.model, list(self.tools.values()), system_prompt=SYSTEM_PROMPT + (f" {rule}" if rule else ""),
            middleware=[_counted_model_calls(work, self.model, cfg), self._kernel_tool_calls(work, cfg, config),
                        ModelCallLimitMiddleware(run_limit=cfg.max_steps, exit_behavior="error")])
        messages: list[Any] = [HumanMessage(content=state["question"])]
        retries = 0
        while True:
            work["format_retries"] = retries
            try:
                messages = agent.invoke({"messages": messages}, config=child_config(config))["messages"]
            except ModelCallLimitExceededError:
                return self.halt({**state, **work}, config, reason="max_steps", answer=None, validated=False,
                                 error=f"the agent made {cfg.max_steps} model calls (max_steps) without an answer",
                                 extra=work)
            text = content_text(messages[-1].content).strip()
            final = answer_format.final_answer(text, keep_label=False) or None
            structured, problem = answer_format.check(fmt, final or "")
            if fmt is None or problem is None or retries >= cfg.max_format_retries:
                break
            retries += 1  # the model is told what is allowed and asked again, in the same conversation
            messages = [*messages, HumanMessage(content=f"Your answer could not be used: {problem}. {rule}")]
        work.update(raw_output=text, structured_answer=structured if fmt is not None and problem is None else None)
        return self.halt({**state, **work}, config, reason="answered" if problem is None else "format_error",
                         answer=final, validated=False,
                         error=None if problem is None else f"no answer in the asked format after {retries} re-prompts: {problem}",
                         extra=work)

    def _kernel_tool_calls(self, work: dict[str, Any], cfg: TCRAGConfig, config: RunnableConfig):
        """The middleware that answers each of the agent's tool calls through :meth:`RunKernel.call_tool`."""
        lock = threading.Lock()  # calls made at once run in LangGraph's threads; the counters are one

        def through_the_kernel(request: Any, handler: Callable[[Any], Any]) -> ToolMessage:
            call = request.tool_call
            tool = self.tools.get(call["name"])
            if tool is None:  # never handed to the ToolNode: the model is told, as a tool error
                return ToolMessage(content=f"[{call['name']} error: unknown_tool] the tools are: "
                                           f"{', '.join(self.tools) or 'none'}",
                                   tool_call_id=call["id"], name=call["name"], status="error")
            with lock:
                record = self.call_tool(work, tool, call["args"], cfg, config)
                work["knowledge"].append({"tool": tool.name, "error" if record.is_error else "text": record.observation})
                event = TraceEvent(step=work.get("steps", 0), action="Tool_Use", op="push", content=tool.name,
                                   stack_depth=1, detail=json.dumps({"tool": tool.name, "input": call["args"],
                                                                     "error": record.error_kind},
                                                                    ensure_ascii=False, default=str))
                work["trace"] = self.record(work.get("trace"), config, event)
            return ToolMessage(content=record.observation, tool_call_id=call["id"], name=tool.name,
                               status="error" if record.is_error else "success")

        return wrap_tool_call(through_the_kernel)


def _counted_model_calls(work: dict[str, Any], model: BaseChatModel, cfg: TCRAGConfig):
    """The middleware that counts each of the agent's model calls into ``work`` (module docstring) and
    gives a local model the run's generation settings."""
    settings = ({"max_new_tokens": cfg.max_new_tokens, "temperature": cfg.temperature}
                if takes_generation_settings(model) else {})

    def counted(request: Any, handler: Callable[[Any], Any]) -> Any:
        if settings:
            request = request.override(model_settings={**request.model_settings, **settings})
        shown = [*([request.system_message] if request.system_message is not None else []), *request.messages]
        try:
            response = handler(request)
        except GraphBubbleUp:  # LangGraph's own control flow (an interrupt), not a model failure
            raise
        except Exception as exc:  # a model/server failure ends the run cleanly, with the reason
            raise RunFailure("model_error", f"{type(exc).__name__}: {exc}") from exc
        usage = dict(work.get("token_usage") or {"prompt": 0, "completion": 0})
        usage["prompt"] = usage.get("prompt", 0) + sum(message_tokens(m) for m in shown) + tools_tokens(
            tool_schemas(request.tools))
        usage["completion"] = usage.get("completion", 0) + sum(
            message_tokens(m) for m in response.result if isinstance(m, AIMessage))
        calls = work.get("llm_calls", 0) + 1
        work.update(llm_calls=calls, steps=calls, token_usage=usage)
        return response

    return wrap_model_call(counted)
