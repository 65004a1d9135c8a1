from django.urls import path, re_path
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerView
from rest_framework.routers import SimpleRouter

from deliveries.api import replay_jobs, views

app_name = "api"

router = SimpleRouter()
router.register("webhooks", views.WebhookViewSet, basename="webhook")
router.register("entrypoints", views.EntrypointViewSet, basename="entrypoint")
router.register("targets", views.TargetViewSet, basename="target")
router.register("events", views.EventViewSet, basename="event")
router.register("deliveries", views.DeliveryViewSet, basename="delivery")
router.register("replays", replay_jobs.ReplayViewSet, basename="replay")
router.register("audit", views.AuditViewSet, basename="audit")

urlpatterns = [
    *router.urls,
    path("schema/", SpectacularAPIView.as_view(), name="schema"),
    path("docs/", SpectacularSwaggerView.as_view(url_name="api:schema"), name="docs"),
    re_path(r"", views.not_found),
]
