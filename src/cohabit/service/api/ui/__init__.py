"""The web page (docs/ui.md): the fleet map, the deployments, the deploy form.
`mount(app)` adds it to the app `service.app.create_app` builds; the page lives at `/`."""

from __future__ import annotations

from fastapi import FastAPI
from fastapi.staticfiles import StaticFiles

from cohabit.service.api.ui.pages import STATIC_DIR, page_router, router

STATIC_PATH = "/ui/static"


def mount(app: FastAPI) -> None:
    """The page at `/`, its fragments under `/ui/`, its script and styles under /ui/static."""
    app.include_router(page_router)
    app.include_router(router)
    app.mount(STATIC_PATH, StaticFiles(directory=STATIC_DIR), name="ui-static")
