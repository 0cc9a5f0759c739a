"""``tcrag serve``: the command-line face of the LangServe server (:mod:`.serve`).

Kept apart from the server so that every other ``tcrag`` command starts without importing the web
stack (FastAPI, Starlette, the auth layer): the server module is imported when ``serve`` runs.
"""

from __future__ import annotations

import inspect
from typing import Any, Optional

from .serve_guard import ServeCaps

__all__ = ["register"]


def register(app: Any) -> None:
    """Add ``tcrag serve`` to the ``tcrag`` typer app: the run options of ``tcrag ask`` (generated from
    :class:`TCRAGConfig`, the same bounded defaults), ``--model``, ``--method``, the served-model,
    monitor and Elasticsearch options, and the server's own."""
    import typer

    from .cli import config_flags, config_from_flags, refuse
    from .run_options import UserError

    server_panel = "Server"

    def serve(
        *,
        host: str = typer.Option("127.0.0.1", help="Network interface to listen on (this machine only by default).",
                                 rich_help_panel=server_panel),
        port: int = typer.Option(8000, min=0, max=65535, help="TCP port.", rich_help_panel=server_panel),
        method: str = typer.Option("tcrag", "--method", help="The method that answers (the names of tcrag ask "
                                   "--method).", rich_help_panel="Model, tools and output"),
        model: Optional[str] = typer.Option(
            None, help="A model folder, a .gguf file or a served model as provider:name (e.g. openai:NAME); "
            "default: the packaged SmolLM2-135M-Instruct.", rich_help_panel="Model, tools and output"),
        device: Optional[str] = typer.Option(None, help="Local models only: where to run it (cpu, cuda, cuda:N, mps).",
                                             show_default="cpu", rich_help_panel="Model, tools and output"),
        dtype: Optional[str] = typer.Option(None, help="Local models only: float32, bfloat16 or float16.",
                                            show_default="float32", rich_help_panel="Model, tools and output"),
        tools: bool = typer.Option(True, "--tools/--no-tools", help="Give the agent the medical tools.",
                                   rich_help_panel="Model, tools and output"),
        base_url: Optional[str] = typer.Option(
            None, help="Served models: the server's API address (e.g. http://127.0.0.1:8000/v1).",
            rich_help_panel="Served models and the state monitor"),
        api_key_env: Optional[str] = typer.Option(
            None, metavar="NAME", help="Served models: the environment variable holding the API key.",
            rich_help_panel="Served models and the state monitor"),
        scorer: Optional[str] = typer.Option(
            None, help="The state monitor: a vLLM or SGLang completions server of the same model, or a local "
            "folder or .gguf file with the same weights; default: the model's own weights (local models).",
            rich_help_panel="Served models and the state monitor"),
        scorer_model: Optional[str] = typer.Option(
            None, metavar="NAME", help="The model name the monitor's server knows the model by.",
            rich_help_panel="Served models and the state monitor"),
        scorer_start_text: str = typer.Option(
            "", help="Text the monitor's server puts before what it scores (the model's start token).",
            rich_help_panel="Served models and the state monitor"),
        es_url: Optional[str] = typer.Option(None, envvar="TCRAG_ES_URL", help="Search documents in this "
                                             "Elasticsearch server instead of the embedded collection.",
                                             rich_help_panel="Documents"),
        es_index: str = typer.Option("tcrag-docs", envvar="TCRAG_ES_INDEX", help="The Elasticsearch index to search.",
                                     rich_help_panel="Documents"),
        es_api_key_env: Optional[str] = typer.Option(None, metavar="NAME", help="The environment variable holding "
                                                     "the Elasticsearch API key.", rich_help_panel="Documents"),
        checkpoint_db: Optional[str] = typer.Option(None, help="SQLite file keeping conversations across restarts.",
                                                    rich_help_panel=server_panel),
        max_threads: int = typer.Option(1000, min=1, help="Conversations kept in memory (without --checkpoint-db).",
                                        rich_help_panel=server_panel),
        users_file: Optional[str] = typer.Option(
            None, envvar="TCRAG_AUTH_USERS", rich_help_panel=server_panel,
            help="Users file (tokens as SHA-256, identities, allowed patients); required beyond this machine."),
        allowed_host: list[str] = typer.Option(
            [], "--allowed-host", rich_help_panel=server_panel,
            help="A host name clients use to reach this server (repeatable; the loopback names always work)."),
        max_body_bytes: int = typer.Option(64 * 1024, min=1, help="Largest request body (bytes).",
                                           rich_help_panel=server_panel),
        scripted: Optional[str] = typer.Option(
            None, help="For tests and demos: replay a JSON script instead of a language model.",
            rich_help_panel=server_panel),
        log_level: str = typer.Option("info", help="Server log level (critical, error, warning, info, debug).",
                                      rich_help_panel=server_panel),
        cap_max_steps: int = typer.Option(ServeCaps().max_steps, min=1, max=1000, rich_help_panel=server_panel,
                                          help="Largest max_steps a request may set."),
        cap_max_new_tokens: int = typer.Option(ServeCaps().max_new_tokens, min=1, max=8192, rich_help_panel=server_panel,
                                               help="Largest max_new_tokens a request may set."),
        cap_max_question_chars: int = typer.Option(ServeCaps().max_question_chars, min=1, max=10_000_000,
                                                   rich_help_panel=server_panel,
                                                   help="Largest max_question_chars a request may set."),
        cap_answer_format_items: int = typer.Option(ServeCaps().answer_format_items, min=1, max=10_000,
                                                    rich_help_panel=server_panel,
                                                    help="Most answers a request's answer_format may list."),
        **config_values: Any,
    ) -> None:
        """Serve the agent over HTTP (LangServe): /tcrag/invoke, /stream, /stream_events, /playground/."""
        import uvicorn
        from pydantic import ValidationError as _ValidationError

        from ..core.config import TCRAGConfig
        from .auth import UserDirectory
        from .run_options import (FACE_DEFAULTS, api_key_from_env, build_for_face, check_method, check_sigma,
                                  make_generator, make_scorer, make_tools, quiet_library_progress, scripted_run)
        from .serve import LOOPBACK_HOSTS, check_exposure, create_app, is_loopback

        quiet_library_progress()
        try:
            try:
                users = UserDirectory.from_file(users_file) if users_file else None
                warning = check_exposure(host, authenticated=users is not None)
            except ValueError as exc:
                raise UserError("Invalid option", str(exc)) from None
            check_method(method)
            components: dict[str, Any] = {}
            if scripted:
                components = scripted_run(scripted, model=model, device=device, dtype=dtype, base_url=base_url,
                                          scorer=scorer)
            try:
                base = None
                if components:  # the script's own settings over the faces' bounded budgets
                    script_cfg = components["config"]
                    base = TCRAGConfig(**{**FACE_DEFAULTS, **{k: getattr(script_cfg, k)
                                                             for k in script_cfg.model_fields_set}})
                cfg = config_from_flags(config_values, base=base)
            except _ValidationError as exc:
                first = exc.errors()[0]
                where = "--" + ".".join(str(p) for p in first["loc"]).replace("_", "-") if first["loc"] else "options"
                raise UserError("Invalid option", f"{where}: {first['msg']}") from None
            if components:
                tool_list = components["tools"]
                if es_url:  # a scripted model driving the real Elasticsearch document tool
                    es_tool = make_tools(True, es_url=es_url, es_index=es_index,
                                         es_api_key=api_key_from_env(es_api_key_env, flag="--es-api-key-env"))[0]
                    tool_list = [es_tool, *(t for t in tool_list if t.name != es_tool.name)]
                graph = build_for_face(method, model=components["model"], tools=tool_list,
                                       scorer=components["scorer"], config=cfg)
            else:
                api_key = api_key_from_env(api_key_env)
                chat = make_generator(model, base_url=base_url, api_key=api_key, device=device, dtype=dtype,
                                      max_new_tokens=cfg.max_new_tokens, temperature=cfg.temperature)
                state_scorer = make_scorer(scorer, generator=chat, served_model=scorer_model, api_key=api_key,
                                           start_text=scorer_start_text)
                check_sigma(cfg, chat)
                tool_list = make_tools(tools, es_url=es_url, es_index=es_index,
                                       es_api_key=api_key_from_env(es_api_key_env, flag="--es-api-key-env"))
                graph = build_for_face(method, model=chat, tools=tool_list, scorer=state_scorer, config=cfg)
        except UserError as exc:
            raise refuse(exc) from None
        if warning:
            typer.echo(warning, err=True)
        hosts = [*LOOPBACK_HOSTS, *allowed_host]
        if not is_loopback(host) and host not in ("0.0.0.0", "::"):
            hosts.append(host)
        application = create_app(graph=graph, tools=tools, checkpoint_db=checkpoint_db, users=users,
                                 allowed_hosts=hosts, max_body_bytes=max_body_bytes, max_threads=max_threads,
                                 caps=ServeCaps(max_steps=cap_max_steps, max_new_tokens=cap_max_new_tokens,
                                                max_question_chars=cap_max_question_chars,
                                                answer_format_items=cap_answer_format_items))
        typer.echo(f"TC-RAG serving on http://{host}:{port}/tcrag (playground: /tcrag/playground/) method={method}"
                   + (f" [authentication: {len(users.users)} users]" if users else " [no authentication]")
                   + (" [SCRIPTED model: not a language model]" if scripted else ""), err=True)
        uvicorn.run(application, host=host, port=port, log_level=log_level)

    own = [p for p in inspect.signature(serve, eval_str=True).parameters.values() if p.kind is not p.VAR_KEYWORD]
    serve.__signature__ = inspect.Signature([*own, *(flag.parameter for flag in config_flags())])  # type: ignore[attr-defined]
    app.command()(serve)
