from django import template

from deliveries import dashboard

register = template.Library()


@register.inclusion_tag("admin/deliveries/dashboard.html", takes_context=True)
def webhooker_dashboard(context):
    return dashboard.context(context["request"].user)
