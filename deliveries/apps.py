import os
from pathlib import Path

from django.apps import AppConfig
from django.conf import settings
from django.core import checks
from django.core.exceptions import ImproperlyConfigured
from django.db.models.signals import pre_save


class DeliveriesConfig(AppConfig):
    name = "deliveries"
    verbose_name = "Webhooks"

    def ready(self):
        from deliveries import audit, tracing
        from deliveries.fields import encrypted_fields, open_loaded_tokens
        from deliveries.logs import stamp_request_ids
        from deliveries.models import ApiKey, Entrypoint, Target, Webhook
        from webhooker.db.sqlite import library

        checks.register(library.check_library)
        stamp_request_ids()
        audit.register(Webhook, Entrypoint, Target, ApiKey)
        for model, _ in encrypted_fields():
            pre_save.connect(
                open_loaded_tokens, sender=model, dispatch_uid=f"tokens-{model.__name__}"
            )
        tracing.setup()
        # Every process writes below these (SQLite file, engine lock and socket,
        # metrics files), and a fresh clone must run with nothing set: created at
        # start rather than when settings are imported, which has no such effects.
        folders = {
            "DATA_DIR": settings.DATA_DIR,
            "PROMETHEUS_MULTIPROC_DIR": os.environ["PROMETHEUS_MULTIPROC_DIR"],
        }
        for name, path in folders.items():
            try:
                Path(path).mkdir(parents=True, exist_ok=True)
            except OSError as exc:
                raise ImproperlyConfigured(
                    f"{name}={str(path)!r} cannot be created: {exc}"
                ) from None
