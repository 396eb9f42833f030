"""The REST API router: every app registers its viewsets here."""

from rest_framework.routers import DefaultRouter

router = DefaultRouter()

urlpatterns = router.urls
