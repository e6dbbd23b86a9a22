"""The REST API under /api: serving, models, model_configs and cluster routers."""
