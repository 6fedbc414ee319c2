"""Alertmanager's webhook payload (version 4), validated strictly enough to reject garbage with a 400."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field


class _Lenient(BaseModel):
    # Alertmanager adds fields over time (e.g. notification_reason in 0.33); accept unknown ones.
    model_config = ConfigDict(extra="allow")


class WebhookAlert(_Lenient):
    status: Literal["firing", "resolved"]
    labels: dict[str, str]
    annotations: dict[str, str] = Field(default_factory=dict)
    startsAt: str
    endsAt: str = ""
    generatorURL: str = ""
    fingerprint: str = ""


class WebhookPayload(_Lenient):
    version: Literal["4"]
    status: Literal["firing", "resolved"]
    receiver: str
    groupKey: str
    alerts: list[WebhookAlert] = Field(min_length=1)
    groupLabels: dict[str, str] = Field(default_factory=dict)
    commonLabels: dict[str, str] = Field(default_factory=dict)
    commonAnnotations: dict[str, str] = Field(default_factory=dict)
    externalURL: str = ""
    truncatedAlerts: int = 0
