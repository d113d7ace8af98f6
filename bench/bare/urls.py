import json

from django.db import connection, transaction
from django.http import HttpResponse, JsonResponse
from django.urls import path
from django.views.decorators.csrf import csrf_exempt


@csrf_exempt
def write(request):
    """Parse the same JSON body a bid carries and insert one row in a transaction."""
    body = json.loads(request.body)
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO bare_bid (quantity, limits, note, created_at) "
            "VALUES (%s, %s, %s, now()) RETURNING id",
            [body["quantity"], json.dumps(body["limits"]), body.get("note", "")],
        )
        (row_id,) = cursor.fetchone()
    return JsonResponse({"id": row_id}, status=201)


def ready(request):
    return HttpResponse("ok")


urlpatterns = [path("bare/", write), path("ready/", ready)]
