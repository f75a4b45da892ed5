"""The `/admin` dashboard: a FastAPI router the service mounts (`service.dashboard.router`)."""

from service.dashboard.routes import router

__all__ = ["router"]
