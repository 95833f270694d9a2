from django.urls import path

from gates import views

urlpatterns = [
    path("", views.home, name="home"),
]
