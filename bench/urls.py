from django.urls import include, path

from bench import views

urlpatterns = [
    path("", include("webhooker.urls")),
    path("bench/noop", views.noop),
    path("bench/durable-floor", views.durable_floor),
    path("bench/celery/<uuid:code>", views.celery_receive),
]
