from django import template

register = template.Library()

# deliveries.admin is imported inside each tag, not above: Django imports every tag
# library when it first builds its template engine, which unfold.admin does while
# it is itself being imported (admin autodiscovery), and deliveries.admin imports
# unfold.admin.


@register.inclusion_tag("admin/deliveries/dashboard.html", takes_context=True)
def webhooker_dashboard(context):
    from deliveries.admin import dashboard

    return dashboard.context(context["request"].user)


@register.simple_tag
def status_badge(status, text=None):
    """{% status_badge delivery.status %}: the status as its coloured badge."""
    from deliveries.admin.base import status_badge

    return status_badge(status, text)
