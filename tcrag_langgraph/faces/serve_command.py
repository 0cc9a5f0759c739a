"""``tcrag serve``: the command-line face of the LangServe server (:mod:`.serve`).

Kept apart from the server so that every other ``tcrag`` command starts without importing the web
stack (FastAPI, Starlette, the auth layer): the server module is imported when ``serve`` runs.
"""

from __future__ import annotations

from typing import Any, Optional

from ..agent.flags import FACE_FLAGS, face_spec
from .serve_guard import ServeCaps

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
            spec = face_spec(options)  # named as AgentSpec's fields (agent.flags.FACE_FLAGS)
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
                                 caps=ServeCaps(max_steps=cap_max_steps, max_new_tokens=cap_max_new_tokens,
                                                max_question_chars=cap_max_question_chars,
                                                answer_format_items=cap_answer_format_items))
        typer.echo(f"TC-RAG serving on http://{host}:{port}/tcrag (playground: /tcrag/playground/) "
                   f"method={options['method']}"
                   + (f" [authentication: {len(users.users)} users]" if users else " [no authentication]")
                   + (" [SCRIPTED model: not a language model]" if options["scripted"] else ""), err=True)
        uvicorn.run(application, host=host, port=port, log_level=log_level)

    serve.__signature__ = FACE_FLAGS.signature(serve)  # type: ignore[attr-defined]
    app.command()(serve)
