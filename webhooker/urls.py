from django.conf import settings
from django.contrib import admin
from django.urls import include, path

urlpatterns = [
    path("admin/", admin.site.urls),
    path("", include("deliveries.urls")),
]

if settings.WEBHOOKER_BENCHMARK:
    from bench import views as bench_views

    urlpatterns += [
        path("bench/noop", bench_views.noop),
        path("bench/celery/<uuid:code>", bench_views.celery_receive),
    ]
