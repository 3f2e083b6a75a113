"""Built-in pools of unrelated tools and unrelated arguments.

Distractors ("an unrelated tool renamed to resemble a called tool"), corrupted duplicates and the
merge fallback of the multi-tool refactor draw from `UNRELATED_TOOLS`; schema twins draw the
argument that replaces a needed one from `UNRELATED_ARGUMENTS`. A fixed, hand-written pool keeps
every perturbation a pure function of (item, seed) with no data loading; `pick_unrelated` chooses
the pool tool whose words overlap least with the tool it must not resemble in meaning.
"""

from __future__ import annotations

import random
import re
from collections.abc import Collection
from typing import Any

from cipr.tools.interface import Tool


def _tool(name: str, description: str, props: dict[str, tuple[str, str]], required: list[str]) -> Tool:
    return Tool(name, description, {"type": "object",
                                    "properties": {k: {"type": t, "description": d}
                                                   for k, (t, d) in props.items()},
                                    "required": required})


UNRELATED_TOOLS: tuple[Tool, ...] = (
    _tool("send_sms", "Sends a text message to a phone number.",
          {"phone_number": ("string", "Recipient phone number in E.164 format."),
           "body": ("string", "Text of the message.")}, ["phone_number", "body"]),
    _tool("translate_text", "Translates a passage of text into a target language.",
          {"text": ("string", "The text to translate."),
           "target_language": ("string", "ISO 639-1 code of the target language.")},
          ["text", "target_language"]),
    _tool("book_meeting_room", "Reserves a meeting room in the office for a time slot.",
          {"room_id": ("string", "Identifier of the room."), "start_time": ("string", "ISO 8601 start time."),
           "duration_minutes": ("integer", "Length of the booking in minutes.")}, ["room_id", "start_time"]),
    _tool("get_stock_quote", "Returns the latest trading price of a listed company's stock.",
          {"ticker": ("string", "Stock ticker symbol, e.g. AAPL.")}, ["ticker"]),
    _tool("play_song", "Starts playback of a song on the user's music player.",
          {"title": ("string", "Title of the song."), "artist": ("string", "Name of the performer.")},
          ["title"]),
    _tool("set_thermostat", "Sets the target temperature of a smart home thermostat.",
          {"degrees": ("number", "Target temperature."), "zone": ("string", "Heating zone of the house.")},
          ["degrees"]),
    _tool("compress_file", "Creates a zip archive from a file on disk.",
          {"file_path": ("string", "Path of the file to compress."),
           "level": ("integer", "Compression level from 1 to 9.")}, ["file_path"]),
    _tool("lookup_word_definition", "Looks up dictionary definitions of an English word.",
          {"word": ("string", "The word to define.")}, ["word"]),
    _tool("order_taxi", "Requests a taxi to pick the user up at an address.",
          {"pickup_address": ("string", "Street address for pickup."),
           "passengers": ("integer", "Number of passengers.")}, ["pickup_address"]),
    _tool("create_calendar_reminder", "Adds a reminder to the user's calendar.",
          {"note": ("string", "What to be reminded about."), "remind_at": ("string", "ISO 8601 time.")},
          ["note", "remind_at"]),
    _tool("scan_qr_code", "Decodes the content of a QR code from an image file.",
          {"image_path": ("string", "Path of the image containing the QR code.")}, ["image_path"]),
    _tool("rate_restaurant", "Submits a star rating for a restaurant the user visited.",
          {"restaurant_id": ("string", "Identifier of the restaurant."),
           "stars": ("integer", "Rating from 1 to 5.")}, ["restaurant_id", "stars"]),
    _tool("water_plants", "Turns on the garden irrigation system for a while.",
          {"minutes": ("integer", "How long to water, in minutes.")}, ["minutes"]),
    _tool("check_parcel_status", "Reports where a shipped parcel currently is.",
          {"tracking_number": ("string", "Carrier tracking number.")}, ["tracking_number"]),
    _tool("generate_password", "Generates a random password.",
          {"length": ("integer", "Number of characters."),
           "include_symbols": ("boolean", "Whether to include punctuation symbols.")}, ["length"]),
    _tool("resize_image", "Scales an image to new pixel dimensions.",
          {"image_path": ("string", "Path of the image."), "width": ("integer", "New width in pixels."),
           "height": ("integer", "New height in pixels.")}, ["image_path", "width", "height"]),
    _tool("feed_pet", "Dispenses food from the automatic pet feeder.",
          {"portion_grams": ("number", "Amount of food in grams.")}, ["portion_grams"]),
    _tool("get_horoscope", "Returns today's horoscope for a zodiac sign.",
          {"sign": ("string", "Zodiac sign, e.g. Leo.")}, ["sign"]),
    _tool("count_steps", "Returns the number of steps the user walked on a day, from the fitness tracker.",
          {"day": ("string", "Date in YYYY-MM-DD format.")}, ["day"]),
    _tool("mute_notifications", "Silences phone notifications for a period.",
          {"hours": ("number", "How many hours to stay silent.")}, ["hours"]),
    _tool("print_document", "Sends a document to the office printer.",
          {"document_path": ("string", "Path of the document."), "copies": ("integer", "Number of copies.")},
          ["document_path"]),
    _tool("lock_front_door", "Locks the smart lock on the front door.",
          {"confirm": ("boolean", "Must be true to lock.")}, ["confirm"]),
    _tool("recommend_podcast", "Suggests podcasts about a topic.",
          {"topic": ("string", "Topic of interest."), "max_results": ("integer", "How many to suggest.")},
          ["topic"]),
    _tool("convert_audio_format", "Converts an audio file to another encoding.",
          {"audio_path": ("string", "Path of the audio file."),
           "target_format": ("string", "Target encoding, e.g. mp3 or flac.")},
          ["audio_path", "target_format"]),
    _tool("start_vacuum_robot", "Starts the robot vacuum cleaner in a room.",
          {"room": ("string", "Room to clean.")}, ["room"]),
    _tool("get_tide_times", "Returns high and low tide times for a coastal station.",
          {"station_id": ("string", "Identifier of the tide station.")}, ["station_id"]),
    _tool("renew_library_book", "Extends the loan period of a borrowed library book.",
          {"barcode": ("string", "Barcode printed on the book.")}, ["barcode"]),
    _tool("spell_check", "Finds spelling mistakes in a piece of text.",
          {"text": ("string", "Text to check."), "dialect": ("string", "en-US or en-GB.")}, ["text"]),
    _tool("dim_lights", "Sets the brightness of the smart lights in a room.",
          {"room": ("string", "Room name."), "brightness_percent": ("integer", "Brightness from 0 to 100.")},
          ["room", "brightness_percent"]),
    _tool("list_wifi_networks", "Lists the wireless networks in range of the device.", {}, []),
)

UNRELATED_ARGUMENTS: tuple[tuple[str, dict[str, Any]], ...] = (
    ("locale", {"type": "string", "description": "Locale used to format the output, e.g. en_US."}),
    ("page_token", {"type": "string", "description": "Opaque token of the result page to return."}),
    ("verbose", {"type": "boolean", "description": "Whether to include debugging details in the output."}),
    ("retry_count", {"type": "integer", "description": "How many times to retry on a network error."}),
    ("theme", {"type": "string", "description": "Colour theme of the rendered output."}),
    ("cache_ttl_seconds", {"type": "integer", "description": "How long the result may be cached."}),
    ("callback_url", {"type": "string", "description": "URL notified when the job finishes."}),
    ("timezone", {"type": "string", "description": "IANA time zone used for timestamps in the output."}),
    ("font_size", {"type": "integer", "description": "Font size of the generated report."}),
    ("trace_id", {"type": "string", "description": "Identifier used to correlate log entries."}),
)

_STOP = frozenset("a an the of to for and or in on by with from is are be this that it its as at into "
                  "given specified based using provided returns return get set".split())


def content_words(text: str) -> set[str]:
    """Lower-case content words of a text or identifier (identifiers are split into their words)."""
    spaced = re.sub(r"([a-z])([A-Z])", r"\1 \2", text)
    return {w for w in re.findall(r"[a-z]{3,}", spaced.lower()) if w not in _STOP}


def pick_unrelated(reference: Tool, rng: random.Random, *, avoid_names: Collection[str] = (),
                   exclude: Collection[str] = ()) -> Tool:
    """A pool tool unrelated to `reference`: among those sharing no content word with its name and
    description (else the least overlapping), one chosen at random; pool names in `avoid_names`
    (already declared) and `exclude` (already used) are skipped."""
    ref = content_words(reference.name) | content_words(reference.description)
    cands = [k for k, t in enumerate(UNRELATED_TOOLS) if t.name not in avoid_names and t.name not in exclude]
    if not cands:
        cands = list(range(len(UNRELATED_TOOLS)))
    scored = [(len(ref & _POOL_WORDS[k]), k) for k in cands]
    best = min(s for s, _ in scored)
    return UNRELATED_TOOLS[rng.choice([k for s, k in scored if s == best])]


_POOL_WORDS = tuple(content_words(t.name) | content_words(t.description) for t in UNRELATED_TOOLS)
