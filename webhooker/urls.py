from django.contrib import admin
from django.urls import include, path

from deliveries.admin import dashboard

urlpatterns = [
    # The dashboard's figures alone, which the admin's index reloads in place.
    path("admin/live/", admin.site.admin_view(dashboard.live), name="dashboard_live"),
    path("admin/", admin.site.urls),
    path("api/v1/", include("deliveries.api.urls")),
    path("", include("deliveries.urls")),
]
