"""``tcrag serve``: the command-line face of the LangServe server (:mod:`.serve`).

Kept apart from the server so that every other ``tcrag`` command starts without importing the web
stack (FastAPI, Starlette, the auth layer): the server module is imported when ``serve`` runs.
"""

from __future__ import annotations

import inspect
from typing import Any, Optional

from ..agent.flags import FACE_FLAGS, face_spec
from .serve_guard import RunLimits, ServeCaps

__all__ = ["register"]


def register(app: Any) -> None:
    """Add ``tcrag serve`` to the ``tcrag`` typer app: the run options of ``tcrag ask`` (generated from
    :class:`TCRAGConfig`, the same bounded defaults), ``--model``, ``--method``, the served-model,
    monitor and Elasticsearch options, and the server's own."""
    import typer

    from ..agent.spec import UserError
    from .cli import quiet_library_progress, refuse

    server_panel = "Server"

    def serve(
        *,
        host: str = typer.Option("127.0.0.1", help="Network interface to listen on (this machine only by default).",
                                 rich_help_panel=server_panel),
        port: int = typer.Option(8000, min=0, max=65535, help="TCP port.", rich_help_panel=server_panel),
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
        log_level: str = typer.Option("info", help="Server log level (critical, error, warning, info, debug).",
                                      rich_help_panel=server_panel),
        review_unvalidated: bool = typer.Option(
            False, "--review-unvalidated", rich_help_panel=server_panel,
            help="Pause every run whose answer the state monitor did not validate until the thread's owner answers "
                 "POST /tcrag/threads/{thread_id}/review (approve, reject or their own answer)."),
        **options: Any,
    ) -> None:
        """Serve the agent over HTTP (LangServe): /tcrag/invoke, /stream, /stream_events, /playground/."""
        import uvicorn

        from .auth import UserDirectory
        from .serve import LOOPBACK_HOSTS, check_exposure, create_app, is_loopback

        quiet_library_progress()
        try:
            try:
                users = UserDirectory.from_file(users_file) if users_file else None
                warning = check_exposure(host, authenticated=users is not None)
            except ValueError as exc:
                raise UserError("Invalid option", str(exc)) from None
            caps = _server_settings(ServeCaps, "cap_", options, UserError)
            limits = _server_settings(RunLimits, "", options, UserError)
            spec = face_spec(options)  # named as AgentSpec's fields (agent.flags.FACE_FLAGS)
            if review_unvalidated:  # the operator's choice, never a request's: the server can resume it
                spec = spec.model_copy(update={"config": spec.config.merged({"review_unvalidated": True})})
            graph = spec.build()
        except UserError as exc:
            raise refuse(exc) from None
        if warning:
            typer.echo(warning, err=True)
        hosts = [*LOOPBACK_HOSTS, *allowed_host]
        if not is_loopback(host) and host not in ("0.0.0.0", "::"):
            hosts.append(host)
        application = create_app(graph=graph, tools=options["tools"], checkpoint_db=checkpoint_db, users=users,
                                 allowed_hosts=hosts, max_body_bytes=max_body_bytes, max_threads=max_threads,
                                 caps=caps, limits=limits)
        typer.echo(f"TC-RAG serving on http://{host}:{port}/tcrag (playground: /tcrag/playground/) "
                   f"method={options['method']}"
                   + (f" [authentication: {len(users.users)} users]" if users else " [no authentication]")
                   + (" [SCRIPTED model: not a language model]" if options["scripted"] else ""), err=True)
        uvicorn.run(application, host=host, port=port, log_level=log_level)

    signature = FACE_FLAGS.signature(serve)
    # the operator's caps (one --cap-NAME flag per ServeCaps field) and load limits (one --NAME flag per
    # RunLimits field); each flag's bounds and help live on its field
    settings = [inspect.Parameter(prefix + name, inspect.Parameter.KEYWORD_ONLY, annotation=field.annotation,
                                  default=typer.Option(field.default, _flag(prefix, name), help=field.description,
                                                       rich_help_panel=server_panel))
                for model, prefix in ((ServeCaps, "cap_"), (RunLimits, ""))
                for name, field in model.model_fields.items()]
    serve.__signature__ = signature.replace(parameters=[*signature.parameters.values(), *settings])  # type: ignore
    app.command()(serve)


def _flag(prefix: str, name: str) -> str:
    return "--" + (prefix + name).replace("_", "-")


def _server_settings(model: Any, prefix: str, options: dict[str, Any], error: Any) -> Any:
    """``model`` (ServeCaps, RunLimits) from its flags; a value out of bounds is a UserError naming the flag."""
    from pydantic import ValidationError

    try:
        return model(**{name: options[prefix + name] for name in model.model_fields})
    except ValidationError as exc:
        first = exc.errors()[0]
        flag = _flag(prefix, str(first["loc"][0]))
        raise error("Invalid option", f"{flag}: {first['msg']}", flag=flag) from None
