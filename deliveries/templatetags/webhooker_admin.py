from django import template

register = template.Library()


@register.inclusion_tag("admin/deliveries/dashboard.html", takes_context=True)
def webhooker_dashboard(context):
    # Imported here, not above: Django imports every tag library when it first
    # builds its template engine, which unfold.admin does while it is itself being
    # imported (admin autodiscovery), and deliveries.admin imports unfold.admin.
    from deliveries.admin import dashboard

    return dashboard.context(context["request"].user)
