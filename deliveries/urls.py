from django.urls import path

from deliveries import ops_views, views

urlpatterns = [
    path("webhook/<uuid:code>", views.receive, name="receive"),
    path("metrics", ops_views.metrics, name="metrics"),
    path(".well-known/healthcheck", ops_views.healthcheck, name="healthcheck"),
]
