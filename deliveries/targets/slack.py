import contextlib
import json

from deliveries.targets import transport
from deliveries.targets.base import TargetURLField, require_url

MESSAGE_LIMIT = 3500


def format_message(task, body: bytes) -> str:
    """Metadata, then the payload in a code block: JSON pretty-printed, cut at 3 500."""
    text = body.decode("utf-8", "replace")
    with contextlib.suppress(ValueError, RecursionError):
        text = json.dumps(json.loads(body), indent=2, ensure_ascii=False)
    if len(text) > MESSAGE_LIMIT:
        text = text[:MESSAGE_LIMIT] + "\n… (truncated)"
    header = (
        f"*Webhook event* `{task.event_code}`\n"
        f"Method: {task.method} · Content-Type: {task.content_type or '-'} · "
        f"Size: {task.body_size} bytes · Received: {task.received_at:%Y-%m-%d %H:%M:%S} UTC"
    )
    return f"{header}\n```\n{text}\n```"


class SlackTarget(transport.SendsHTTP):
    type = "slack"
    label = "Slack-compatible channel"
    retries = True
    main_field = "webhook_url"

    @classmethod
    def clean_config(cls, config, *, stored=None):
        return {"webhook_url": require_url(config, "webhook_url")}

    @classmethod
    def form_fields(cls):
        return {
            "webhook_url": TargetURLField(
                secret_path=True,
                label="Slack webhook URL",
                help_text="Slack targets: the incoming-webhook URL (Slack, Mattermost, …).",
                error_messages={"required": "A Slack target needs its webhook URL."},
            )
        }

    def request(self, task, body):
        # A transform's output is the message itself (Slack's {"text": ...} or
        # blocks); else the event is shown as it came.
        if task.transformed:
            payload = body
        else:
            payload = json.dumps({"text": format_message(task, body)}).encode()
        return transport.request(
            task.target.config["webhook_url"],
            data=payload,
            headers={"Content-Type": "application/json"},
            timeout=None,
        )
