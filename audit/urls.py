from django.urls import path

from audit import views

urlpatterns = [
    path("", views.audit_review, name="audit_review"),
    path("verify/", views.audit_verify, name="audit_verify"),
    path("export.csv", views.audit_export, name="audit_export"),
]
