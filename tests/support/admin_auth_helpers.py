"""Helpers shared by the tiers of test_admin_auth."""

from __future__ import annotations

import base64
import os

TOKEN = base64.b64encode(os.urandom(32)).decode()
