from django.urls import path

from deliveries import views

urlpatterns = [
    path("webhook/<uuid:code>", views.receive, name="receive"),
]
