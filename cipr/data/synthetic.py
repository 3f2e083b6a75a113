"""A seeded procedural generator of tool-calling Examples over a catalog of realistic tools.

It feeds the CPU demo job (SFT warm start, then GRPO on a 135M model) and tests, so every query
states the values its reference calls need: each string or number argument appears verbatim in the
query (lists as comma-separated items), and enum or boolean arguments that a template implies are
fixed by its wording ("Dim the kitchen lights to 40 percent" -> action "dim"). Which tool to call
follows from the request; distractor tools share the domain about half the time, so the choice is not
trivial, but templates of same-domain tools ask for different things.

Catalog: 56 tools over 15 domains (weather, travel, finance, calendar, email, maps, shopping, math,
files, media, news, language, fitness, home, food), each with a real description and a JSON Schema
(types, required, enums, bounds, patterns), one or more query templates per tool, and a phrase for
what it does (used when a request cannot be served).

Kinds of examples:
- `single`: one call.
- `parallel`: two or three calls in one turn, either the same tool with different values or
  different tools (possibly from different domains); the query joins the requests.
- `no_call` (with a `response`): small talk / general knowledge that needs no tool, or a request
  whose tool (and every tool of its domain) is absent from the interface, answered by saying so.

Determinism: example i of seed s uses `random.Random(f"cipr-synthetic:{s}:{i}")` (string seeds are
hashed with SHA-512, independent of PYTHONHASHSEED), so the output is a function of (n, seed,
options), and `generate_synthetic(n, s)` is a prefix of `generate_synthetic(m, s)` for m > n. The
kind of each example is drawn with the given fractions, so counts per kind vary around them.
"""

from __future__ import annotations

import datetime as _dt
import json
import random
import string
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

from cipr.tools.interface import Call, Example, Interface, Message, Tool

# ---------------------------------------------------------------------------------------------
# Catalog model
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Intent:
    """A query template: `{param}` placeholders are filled with sampled values; `fixed` arguments are
    implied by the wording. The call passes exactly the placeholders plus `fixed`."""

    template: str
    fixed: Mapping[str, Any] = field(default_factory=dict)

    @property
    def slots(self) -> tuple[str, ...]:
        return tuple(f for _, f, _, _ in string.Formatter().parse(self.template) if f)


@dataclass(frozen=True)
class CatalogTool:
    """A catalog entry: the Tool, its domain, its query templates, and what it does (for refusals)."""

    tool: Tool
    domain: str
    intents: tuple[Intent, ...]
    capability: str


def _s(desc: str, **kw: Any) -> dict[str, Any]:
    return {"type": "string", "description": desc, **kw}


def _i(desc: str, lo: int, hi: int) -> dict[str, Any]:
    return {"type": "integer", "description": desc, "minimum": lo, "maximum": hi}


def _n(desc: str, **kw: Any) -> dict[str, Any]:
    return {"type": "number", "description": desc, **kw}


def _e(desc: str, values: Sequence[str]) -> dict[str, Any]:
    return {"type": "string", "description": desc, "enum": list(values)}


def _a(desc: str, items: Mapping[str, Any], lo: int = 1) -> dict[str, Any]:
    return {"type": "array", "description": desc, "items": dict(items), "minItems": lo}


_DATE = {"format": "date", "pattern": r"^\d{4}-\d{2}-\d{2}$"}
_TIME = {"pattern": r"^\d{2}:\d{2}$"}
_CODE3 = {"pattern": r"^[A-Z]{3}$"}


def _tool(domain: str, name: str, description: str, props: Mapping[str, Any], required: Sequence[str],
          intents: Sequence[str | tuple[str, Mapping[str, Any]]], capability: str) -> CatalogTool:
    params = {"type": "object", "properties": dict(props), "required": list(required)}
    its = tuple(Intent(i) if isinstance(i, str) else Intent(i[0], dict(i[1])) for i in intents)
    return CatalogTool(Tool(name, description, params), domain, its, capability)


UNITS = ("celsius", "fahrenheit")
CABINS = ("economy", "premium", "business", "first")
CAR_CLASSES = ("economy", "compact", "midsize", "SUV", "van", "convertible")
COINS = ("bitcoin", "ethereum", "solana", "cardano", "dogecoin", "litecoin", "polkadot")
PLACE_TYPES = ("restaurant", "cafe", "pharmacy", "hospital", "supermarket", "atm", "parking", "gym", "bakery",
               "museum")
MODES = ("driving", "walking", "bicycling", "transit")
CATEGORIES = ("electronics", "sports", "home", "kitchen", "books", "clothing", "toys", "beauty")
MEASURE_UNITS = ("kilometers", "miles", "meters", "feet", "kilograms", "pounds", "liters", "gallons", "celsius",
                 "fahrenheit")
UNIT_PAIRS = (("kilometers", "miles"), ("miles", "kilometers"), ("meters", "feet"), ("feet", "meters"),
              ("kilograms", "pounds"), ("pounds", "kilograms"), ("liters", "gallons"), ("gallons", "liters"),
              ("celsius", "fahrenheit"), ("fahrenheit", "celsius"))
STATISTICS = ("mean", "median", "variance", "range", "sum")
GENRES = ("action", "comedy", "drama", "horror", "documentary", "animation", "thriller", "romance")
NEWS_CATEGORIES = ("business", "technology", "sports", "science", "health", "entertainment")
NEWS_COUNTRIES = ("United States", "United Kingdom", "Germany", "France", "Japan", "India", "Canada", "Australia")
LANGUAGES = ("English", "Spanish", "French", "German", "Italian", "Japanese", "Korean", "Chinese", "Portuguese")
ACTIVITIES = ("running", "cycling", "swimming", "yoga", "walking", "rowing", "hiking")
DIETS = ("vegetarian", "vegan", "gluten-free", "keto")
EMAIL_FOLDERS = ("inbox", "sent", "archive", "spam")
CALENDARS = ("work", "personal", "family")


def _catalog() -> tuple[CatalogTool, ...]:
    t = _tool
    return (
        # weather
        t("weather", "get_current_weather", "Get the current weather conditions (temperature, humidity, wind, "
          "sky) for a city.",
          {"city": _s("City name, e.g. 'Paris'."), "units": _e("Temperature units.", UNITS)}, ["city"],
          ["What's the weather like in {city} right now?", "What's the current temperature in {city} in {units}?",
           "Is it raining in {city} at the moment?"], "check the current weather"),
        t("weather", "get_weather_forecast", "Get the daily weather forecast for a city for the next 1 to 14 days.",
          {"city": _s("City name."), "days": _i("Number of days to forecast.", 1, 14),
           "units": _e("Temperature units.", UNITS)}, ["city", "days"],
          ["Give me the {days}-day forecast for {city}.",
           "What will the weather be in {city} over the next {days} days, in {units}?"],
          "get a weather forecast"),
        t("weather", "get_air_quality", "Get the current air quality index (AQI) and main pollutants for a city.",
          {"city": _s("City name.")}, ["city"],
          ["How is the air quality in {city} today?", "Check the AQI in {city}."], "check air quality"),
        t("weather", "get_uv_index", "Get the UV index for a city on a given date (today if no date is given).",
          {"city": _s("City name."), "date": _s("Date, YYYY-MM-DD.", **_DATE)}, ["city"],
          ["What's the UV index in {city}?", "What will the UV index be in {city} on {date}?"],
          "look up the UV index"),
        # travel
        t("travel", "search_flights", "Search available flights between two airports on a date, optionally "
          "with a return date, passenger count and cabin class.",
          {"origin": _s("Departure airport IATA code, e.g. 'JFK'.", **_CODE3),
           "destination": _s("Arrival airport IATA code.", **_CODE3),
           "departure_date": _s("Departure date, YYYY-MM-DD.", **_DATE),
           "return_date": _s("Return date for a round trip, YYYY-MM-DD.", **_DATE),
           "passengers": _i("Number of passengers.", 1, 9), "cabin_class": _e("Cabin class.", CABINS)},
          ["origin", "destination", "departure_date"],
          ["Find flights from {origin} to {destination} on {departure_date}.",
           "Search round-trip flights from {origin} to {destination}, leaving {departure_date} and returning "
           "{return_date}.",
           "I need {passengers} {cabin_class} class seats from {origin} to {destination} on {departure_date}."],
          "search for flights"),
        t("travel", "book_hotel", "Book hotel rooms in a city for given check-in and check-out dates.",
          {"city": _s("City name."), "check_in": _s("Check-in date, YYYY-MM-DD.", **_DATE),
           "check_out": _s("Check-out date, YYYY-MM-DD.", **_DATE), "guests": _i("Number of guests.", 1, 8),
           "rooms": _i("Number of rooms.", 1, 4)}, ["city", "check_in", "check_out", "guests"],
          ["Book a hotel in {city} from {check_in} to {check_out} for {guests} guests.",
           "Please reserve {rooms} hotel rooms in {city} for {guests} guests, checking in {check_in} and "
           "checking out {check_out}."], "book a hotel"),
        t("travel", "search_hotels", "Search hotels in a city for a stay, filtered by nightly price and star rating.",
          {"city": _s("City name."), "check_in": _s("Check-in date, YYYY-MM-DD.", **_DATE),
           "check_out": _s("Check-out date, YYYY-MM-DD.", **_DATE),
           "max_price": _n("Maximum price per night in US dollars.", minimum=0),
           "min_rating": _n("Minimum star rating (1-5).", minimum=1, maximum=5)}, ["city", "check_in", "check_out"],
          ["Show me hotels in {city} between {check_in} and {check_out} under {max_price} dollars a night.",
           "What hotels in {city} rated at least {min_rating} stars are available from {check_in} to "
           "{check_out}?"], "search for hotels"),
        t("travel", "get_flight_status", "Get the live status (on time, delayed, cancelled, gate) of a flight.",
          {"flight_number": _s("Airline code and flight number, e.g. 'UA857'."),
           "date": _s("Flight date, YYYY-MM-DD.", **_DATE)}, ["flight_number"],
          ["What's the status of flight {flight_number}?", "Is flight {flight_number} on {date} on time?"],
          "check a flight's status"),
        t("travel", "rent_car", "Reserve a rental car at a pickup location for a date range and vehicle class.",
          {"pickup_location": _s("Where to pick up the car."),
           "pickup_date": _s("Pickup date, YYYY-MM-DD.", **_DATE),
           "return_date": _s("Return date, YYYY-MM-DD.", **_DATE), "car_type": _e("Vehicle class.", CAR_CLASSES)},
          ["pickup_location", "pickup_date", "return_date"],
          ["Reserve a rental car at {pickup_location} from {pickup_date} to {return_date}.",
           "I need a {car_type} rental car at {pickup_location}, picking up {pickup_date} and returning "
           "{return_date}."], "rent a car"),
        t("travel", "get_visa_requirements", "Tell whether citizens of one country need a visa to visit another, "
          "and which kind.",
          {"citizenship": _s("Traveler's country of citizenship."),
           "destination_country": _s("Country to visit.")}, ["citizenship", "destination_country"],
          ["Do citizens of {citizenship} need a visa to visit {destination_country}?"],
          "check visa requirements"),
        # finance
        t("finance", "get_stock_price", "Get the latest trading price of a stock by its ticker symbol.",
          {"symbol": _s("Stock ticker symbol, e.g. 'AAPL'.")}, ["symbol"],
          ["What's the current price of {symbol} stock?", "How much is one share of {symbol} trading at?"],
          "look up stock prices"),
        t("finance", "get_stock_history", "Get historical prices of a stock between two dates at a daily, weekly "
          "or monthly interval.",
          {"symbol": _s("Stock ticker symbol."), "start_date": _s("First date, YYYY-MM-DD.", **_DATE),
           "end_date": _s("Last date, YYYY-MM-DD.", **_DATE),
           "interval": _e("Sampling interval.", ("daily", "weekly", "monthly"))},
          ["symbol", "start_date", "end_date"],
          ["Get {interval} prices for {symbol} from {start_date} to {end_date}.",
           "Show me the price history of {symbol} between {start_date} and {end_date}."],
          "get historical stock prices"),
        t("finance", "convert_currency", "Convert an amount of money from one currency to another at today's rate.",
          {"amount": _n("Amount to convert.", minimum=0),
           "from_currency": _s("ISO 4217 code of the source currency, e.g. 'USD'.", **_CODE3),
           "to_currency": _s("ISO 4217 code of the target currency.", **_CODE3)},
          ["amount", "from_currency", "to_currency"],
          ["Convert {amount} {from_currency} to {to_currency}.", "How much is {amount} {from_currency} in "
           "{to_currency}?"], "convert currencies"),
        t("finance", "get_exchange_rate", "Get the current exchange rate between two currencies.",
          {"base_currency": _s("ISO 4217 code of the base currency.", **_CODE3),
           "target_currency": _s("ISO 4217 code of the quote currency.", **_CODE3)},
          ["base_currency", "target_currency"],
          ["What's the exchange rate from {base_currency} to {target_currency}?"], "look up exchange rates"),
        t("finance", "calculate_loan_payment", "Compute the fixed monthly payment of an amortized loan.",
          {"principal": _n("Loan amount in dollars.", minimum=0),
           "annual_rate": _n("Annual interest rate in percent.", minimum=0, maximum=100),
           "term_months": _i("Loan term in months.", 1, 480)}, ["principal", "annual_rate", "term_months"],
          ["What would the monthly payment be on a {principal} dollar loan at {annual_rate}% over {term_months} "
           "months?"], "calculate loan payments"),
        t("finance", "get_crypto_price", "Get the current price of a cryptocurrency in a fiat currency.",
          {"coin": _e("Cryptocurrency.", COINS), "currency": _s("ISO 4217 code of the quote currency.", **_CODE3)},
          ["coin"],
          ["What's the price of {coin} right now?", "How much is {coin} worth in {currency}?"],
          "check cryptocurrency prices"),
        # calendar
        t("calendar", "create_event", "Create an event in the user's calendar.",
          {"title": _s("Event title."), "date": _s("Date, YYYY-MM-DD.", **_DATE),
           "start_time": _s("Start time, HH:MM (24-hour).", **_TIME),
           "duration_minutes": _i("Duration in minutes.", 5, 600), "location": _s("Where the event takes place.")},
          ["title", "date", "start_time"],
          ["Schedule '{title}' on {date} at {start_time}.",
           "Add '{title}' to my calendar on {date} at {start_time} for {duration_minutes} minutes at "
           "{location}."], "create calendar events"),
        t("calendar", "list_events", "List the events in the user's calendar on a date.",
          {"date": _s("Date, YYYY-MM-DD.", **_DATE), "calendar": _e("Which calendar.", CALENDARS)}, ["date"],
          ["What's on my calendar on {date}?", "Show my {calendar} events for {date}."],
          "look at your calendar"),
        t("calendar", "delete_event", "Delete a calendar event by its id.",
          {"event_id": _s("The event's id, e.g. 'evt_3f9a2c'.")}, ["event_id"],
          ["Delete the calendar event with ID {event_id}.", "Cancel event {event_id}."],
          "delete calendar events"),
        t("calendar", "set_reminder", "Set a reminder that notifies the user at a date and time.",
          {"message": _s("What to be reminded of."), "date": _s("Date, YYYY-MM-DD.", **_DATE),
           "time": _s("Time, HH:MM (24-hour).", **_TIME)}, ["message", "date", "time"],
          ["Remind me to {message} on {date} at {time}."], "set reminders"),
        # email and messaging
        t("email", "send_email", "Send an email from the user's account.",
          {"to": _s("Recipient email address.", format="email"), "subject": _s("Subject line."),
           "body": _s("Message body.")}, ["to", "subject", "body"],
          ["Send an email to {to} with the subject '{subject}' saying '{body}'.",
           "Email {to}: subject '{subject}', message '{body}'."], "send emails"),
        t("email", "search_emails", "Search the user's mailbox for messages matching a text query.",
          {"query": _s("Text to search for."), "folder": _e("Mailbox folder.", EMAIL_FOLDERS),
           "max_results": _i("Maximum number of messages.", 1, 100)}, ["query"],
          ["Search my {folder} for emails about '{query}'.",
           "Find up to {max_results} emails matching '{query}'."], "search your email"),
        t("email", "send_sms", "Send a text message (SMS) to a phone number.",
          {"phone_number": _s("Phone number in international format."), "message": _s("Text of the message.")},
          ["phone_number", "message"],
          ["Text {phone_number}: '{message}'.", "Send an SMS to {phone_number} saying '{message}'."],
          "send text messages"),
        t("email", "post_slack_message", "Post a message to a Slack channel.",
          {"channel": _s("Channel name, e.g. '#general'."), "text": _s("Message text.")}, ["channel", "text"],
          ["Post '{text}' in the {channel} Slack channel."], "post to Slack"),
        # maps
        t("maps", "get_directions", "Get step-by-step directions between two places for a travel mode.",
          {"origin": _s("Starting point (address or place)."), "destination": _s("End point (address or place)."),
           "mode": _e("Travel mode.", MODES)}, ["origin", "destination"],
          ["Give me {mode} directions from {origin} to {destination}.",
           "How do I get from {origin} to {destination}?"], "give directions"),
        t("maps", "find_nearby_places", "Find places of a given type within a radius of a location.",
          {"location": _s("Center of the search (address or place)."), "place_type": _e("Kind of place.", PLACE_TYPES),
           "radius_meters": _i("Search radius in meters.", 50, 50000)}, ["location", "place_type"],
          ["Find a {place_type} near {location}.", "Is there a {place_type} within {radius_meters} meters of "
           "{location}?"], "find nearby places"),
        t("maps", "geocode_address", "Convert a street address into latitude and longitude coordinates.",
          {"address": _s("Full street address.")}, ["address"],
          ["What are the coordinates of {address}?", "Geocode this address: {address}."], "geocode addresses"),
        t("maps", "get_travel_time", "Estimate the travel time between two places for a travel mode.",
          {"origin": _s("Starting point."), "destination": _s("End point."), "mode": _e("Travel mode.", MODES)},
          ["origin", "destination", "mode"],
          ["Estimate the {mode} time from {origin} to {destination}."], "estimate travel times"),
        # shopping
        t("shopping", "search_products", "Search the online store's catalog, optionally within a category and "
          "under a price.",
          {"query": _s("What to search for."), "max_price": _n("Maximum price in dollars.", minimum=0),
           "category": _e("Store department.", CATEGORIES)}, ["query"],
          ["Search the store for {query}.", "Find {query} under {max_price} dollars.",
           "Look for {query} in the {category} department."], "search the store"),
        t("shopping", "add_to_cart", "Add a quantity of a product to the shopping cart.",
          {"product_id": _s("Product id, e.g. 'SKU-10482'."), "quantity": _i("How many.", 1, 20)},
          ["product_id", "quantity"], ["Add {quantity} of product {product_id} to my cart."],
          "add items to your cart"),
        t("shopping", "track_order", "Get the shipping status and expected delivery date of an order.",
          {"order_id": _s("Order id, e.g. 'ORD-204817'.")}, ["order_id"],
          ["Where is my order {order_id}?", "Track order {order_id} for me."], "track orders"),
        t("shopping", "get_product_reviews", "Get customer reviews of a product, optionally only those with a "
          "minimum star rating.",
          {"product_id": _s("Product id."), "min_rating": _i("Only reviews with at least this many stars.", 1, 5)},
          ["product_id"],
          ["Show me the reviews for product {product_id}.", "Show me reviews of {product_id} with at least "
           "{min_rating} stars."], "read product reviews"),
        # math
        t("math", "calculate_expression", "Evaluate an arithmetic expression and return the result.",
          {"expression": _s("The expression, e.g. '(3 + 4) * 2'.")}, ["expression"],
          ["Calculate {expression}.", "What is {expression}?"], "do calculations"),
        t("math", "convert_units", "Convert a quantity between units of length, mass, volume or temperature.",
          {"value": _n("The quantity to convert."), "from_unit": _e("Unit of the value.", MEASURE_UNITS),
           "to_unit": _e("Unit to convert to.", MEASURE_UNITS)}, ["value", "from_unit", "to_unit"],
          ["Convert {value} {from_unit} to {to_unit}.", "How many {to_unit} is {value} {from_unit}?"],
          "convert units"),
        t("math", "calculate_percentage", "Compute what percentage one number is of another.",
          {"part": _n("The part."), "whole": _n("The whole.", exclusiveMinimum=0)}, ["part", "whole"],
          ["What percentage of {whole} is {part}?"], "compute percentages"),
        t("math", "solve_quadratic", "Solve a*x^2 + b*x + c = 0 for real or complex roots.",
          {"a": _n("Coefficient of x^2 (not zero)."), "b": _n("Coefficient of x."), "c": _n("Constant term.")},
          ["a", "b", "c"], ["Solve the quadratic equation with a = {a}, b = {b} and c = {c}."],
          "solve equations"),
        t("math", "compute_statistics", "Compute a summary statistic of a list of numbers.",
          {"numbers": _a("The data.", {"type": "number"}), "statistic": _e("Which statistic.", STATISTICS)},
          ["numbers", "statistic"], ["What is the {statistic} of {numbers}?",
                                     "Compute the {statistic} of these numbers: {numbers}."],
          "compute statistics"),
        # files
        t("files", "read_file", "Read a text file and return its contents.",
          {"path": _s("Path of the file.")}, ["path"],
          ["Show me the contents of {path}.", "Open {path} and read it to me."], "read files"),
        t("files", "write_file", "Write text to a file, replacing its contents.",
          {"path": _s("Path of the file."), "content": _s("Text to write.")}, ["path", "content"],
          ["Write '{content}' to {path}."], "write files"),
        t("files", "list_directory", "List the files in a directory.",
          {"path": _s("Directory path."), "include_hidden": {"type": "boolean",
                                                             "description": "Also list hidden files."}},
          ["path"],
          ["What files are in {path}?", ("List everything in {path}, including hidden files.",
                                         {"include_hidden": True})], "list directories"),
        t("files", "compress_files", "Compress files into a zip or tar.gz archive.",
          {"paths": _a("Files to include.", {"type": "string"}), "archive_name": _s("Name of the archive.")},
          ["paths", "archive_name"], ["Compress {paths} into {archive_name}."], "compress files"),
        # media
        t("media", "play_song", "Play a song on the user's speaker, optionally by a given artist.",
          {"title": _s("Song title."), "artist": _s("Performing artist.")}, ["title"],
          ["Play {title}.", "Play {title} by {artist}."], "play music"),
        t("media", "search_movies", "Search movies by genre and release year.",
          {"genre": _e("Movie genre.", GENRES), "year": _i("Release year.", 1920, 2025)}, ["genre"],
          ["Recommend some {genre} movies.", "Find {genre} movies released in {year}."], "search for movies"),
        t("media", "get_podcast_episodes", "List the latest episodes of a podcast.",
          {"podcast_name": _s("Podcast title."), "limit": _i("How many episodes.", 1, 50)}, ["podcast_name"],
          ["What are the latest episodes of {podcast_name}?", "Show the last {limit} episodes of {podcast_name}."],
          "browse podcasts"),
        # news
        t("news", "get_top_headlines", "Get today's top news headlines, optionally for a category and country.",
          {"category": _e("News category.", NEWS_CATEGORIES), "country": _e("Country edition.", NEWS_COUNTRIES)},
          [], ["What are today's top {category} headlines?",
               "What are today's top {category} headlines in {country}?"], "get news headlines"),
        t("news", "search_news", "Search news articles about a topic, optionally published since a date.",
          {"query": _s("Topic to search for."), "from_date": _s("Earliest publication date, YYYY-MM-DD.", **_DATE)},
          ["query"], ["Find news articles about {query}.", "Find news about {query} published since {from_date}."],
          "search the news"),
        # language
        t("language", "translate_text", "Translate text into a target language.",
          {"text": _s("Text to translate."), "target_language": _e("Language to translate into.", LANGUAGES),
           "source_language": _e("Language of the text (detected if omitted).", LANGUAGES)},
          ["text", "target_language"],
          ["Translate '{text}' into {target_language}.",
           "Translate '{text}' from {source_language} to {target_language}."], "translate text"),
        t("language", "detect_language", "Detect which language a piece of text is written in.",
          {"text": _s("Text to analyze.")}, ["text"], ["Which language is this: '{text}'?"], "detect languages"),
        t("language", "define_word", "Look up the dictionary definition of an English word.",
          {"word": _s("The word to define.")}, ["word"],
          ["What does the word '{word}' mean?", "Define '{word}'."], "look up word definitions"),
        # fitness
        t("fitness", "log_workout", "Record a workout in the user's fitness log.",
          {"activity": _e("Type of workout.", ACTIVITIES), "duration_minutes": _i("Duration in minutes.", 1, 600),
           "distance_km": _n("Distance in kilometers.", minimum=0)}, ["activity", "duration_minutes"],
          ["Log a {duration_minutes}-minute {activity} workout.",
           "Log my {activity} today: {distance_km} km in {duration_minutes} minutes."], "log workouts"),
        t("fitness", "calculate_bmi", "Compute body mass index from weight and height.",
          {"weight_kg": _n("Weight in kilograms.", exclusiveMinimum=0),
           "height_cm": _n("Height in centimeters.", exclusiveMinimum=0)}, ["weight_kg", "height_cm"],
          ["Calculate my BMI: I weigh {weight_kg} kg and I'm {height_cm} cm tall."], "calculate BMI"),
        # home
        t("home", "set_thermostat", "Set the target temperature (Celsius) of a room's thermostat.",
          {"room": _s("Room name."), "temperature": _n("Target temperature in Celsius.", minimum=5, maximum=35),
           "mode": _e("Thermostat mode.", ("heat", "cool", "auto"))}, ["room", "temperature"],
          ["Set the {room} thermostat to {temperature} degrees.",
           "Set the {room} to {temperature} degrees in {mode} mode."], "control the thermostat"),
        t("home", "control_lights", "Turn a room's lights on or off, or dim them to a brightness.",
          {"room": _s("Room name."), "action": _e("What to do.", ("on", "off", "dim")),
           "brightness": _i("Brightness in percent (for dim).", 0, 100)}, ["room", "action"],
          [("Turn on the lights in the {room}.", {"action": "on"}),
           ("Switch off the {room} lights.", {"action": "off"}),
           ("Dim the {room} lights to {brightness} percent.", {"action": "dim"})], "control the lights"),
        t("home", "lock_door", "Lock one of the house's smart locks.",
          {"door": _e("Which door.", ("front", "back", "garage", "side"))}, ["door"],
          ["Lock the {door} door.", "Make sure the {door} door is locked."], "lock doors"),
        # food
        t("food", "find_recipes", "Find recipes that use given ingredients, optionally for a diet and time limit.",
          {"ingredients": _a("Ingredients to use.", {"type": "string"}), "diet": _e("Dietary restriction.", DIETS),
           "max_prep_minutes": _i("Maximum preparation time in minutes.", 5, 300)}, ["ingredients"],
          ["Find a recipe using {ingredients}.",
           "Find a {diet} recipe with {ingredients} that takes under {max_prep_minutes} minutes."],
          "find recipes"),
        t("food", "order_food", "Order food delivery from a restaurant.",
          {"restaurant": _s("Restaurant name."), "items": _a("Dishes to order.", {"type": "string"}),
           "delivery_address": _s("Where to deliver.")}, ["restaurant", "items", "delivery_address"],
          ["Order {items} from {restaurant} to {delivery_address}."], "order food delivery"),
    )


# ---------------------------------------------------------------------------------------------
# Value pools and samplers
# ---------------------------------------------------------------------------------------------

CITIES = ("Paris", "Tokyo", "New York", "London", "Berlin", "Sydney", "Toronto", "Madrid", "Rome", "Seoul",
          "Mumbai", "Cairo", "Lisbon", "Amsterdam", "Chicago", "Singapore", "Dubai", "Vienna", "Prague",
          "Stockholm", "Mexico City", "Buenos Aires", "Cape Town", "Bangkok", "Istanbul", "Oslo", "Dublin",
          "Seattle", "Boston", "Nairobi")
AIRPORTS = ("JFK", "LAX", "SFO", "ORD", "LHR", "CDG", "FRA", "AMS", "NRT", "HND", "SIN", "DXB", "SYD", "YYZ",
            "MAD", "FCO", "ICN", "BCN", "SEA", "BOS", "MUC", "ZRH", "IST", "DUB")
COUNTRIES = ("Japan", "Brazil", "India", "Canada", "Germany", "Kenya", "Australia", "Mexico", "France", "Thailand",
             "Egypt", "Vietnam", "Turkey", "South Africa", "Argentina", "Italy", "United States", "Nigeria",
             "Philippines", "United Kingdom")
STOCKS = ("AAPL", "MSFT", "GOOGL", "AMZN", "TSLA", "NVDA", "META", "NFLX", "JPM", "KO", "DIS", "INTC", "AMD",
          "IBM", "ORCL")
CURRENCIES = ("USD", "EUR", "GBP", "JPY", "CAD", "AUD", "CHF", "CNY", "INR", "MXN", "SEK", "NZD", "KRW", "BRL")
PEOPLE = ("alice.chen", "bob.martin", "carla.rossi", "dev.patel", "emma.schmidt", "farid.haddad", "grace.kim",
          "hugo.silva", "ines.moreau", "jack.obrien")
LANDMARKS = ("Union Square, San Francisco", "Times Square", "the Eiffel Tower", "Central Station",
             "Heathrow Airport", "Golden Gate Park", "the British Museum", "Shibuya Crossing", "Alexanderplatz",
             "Harvard University", "Stanley Park", "the Colosseum")
ADDRESSES = ("1600 Amphitheatre Parkway, Mountain View, CA", "221B Baker Street, London",
             "350 Fifth Avenue, New York, NY", "1 Infinite Loop, Cupertino, CA", "10 Downing Street, London",
             "5 Avenue Anatole France, Paris", "742 Evergreen Terrace, Springfield", "1 Harbour Street, Sydney")
FILES = ("/home/alex/notes/todo.txt", "/var/log/app/error.log", "/home/alex/reports/q3_summary.csv",
         "~/Documents/resume.pdf", "/etc/nginx/nginx.conf", "/data/exports/users.json", "~/Desktop/budget.xlsx",
         "/home/alex/photos/beach.jpg")
DIRS = ("/home/alex/Downloads", "/var/log", "~/Projects/website", "/tmp/build", "/data/exports", "~/Music")
SONGS = (("Bohemian Rhapsody", "Queen"), ("Billie Jean", "Michael Jackson"), ("Hey Jude", "The Beatles"),
         ("Rolling in the Deep", "Adele"), ("Smells Like Teen Spirit", "Nirvana"), ("Shape of You", "Ed Sheeran"),
         ("Hotel California", "Eagles"), ("Clair de Lune", "Claude Debussy"), ("Blinding Lights", "The Weeknd"),
         ("Imagine", "John Lennon"))

_POOLS: dict[str, Sequence[Any]] = {
    "city": CITIES, "citizenship": COUNTRIES, "destination_country": COUNTRIES, "symbol": STOCKS,
    "flight_number": ("UA857", "BA117", "LH400", "AF22", "DL45", "NH10", "QF1", "EK202", "AA100", "KL641"),
    "pickup_location": ("Denver International Airport", "downtown Chicago", "Orlando Airport",
                        "Union Station, Los Angeles", "Nice Airport", "Munich Central Station"),
    "amount": (20, 50, 75, 100, 120, 250, 500, 1000, 1500, 2500, 10000, 19.99, 49.5, 129.95),
    "principal": (5000, 15000, 25000, 180000, 250000, 320000, 450000),
    "annual_rate": (3.5, 4.25, 5, 5.75, 6.1, 6.5, 7.2),
    "term_months": (12, 24, 36, 48, 60, 120, 180, 360),
    "title": ("Team standup", "Dentist appointment", "Quarterly review", "Lunch with Maria", "Yoga class",
              "Project kickoff", "Parent-teacher meeting", "Book club", "Car service"),
    "duration_minutes": (15, 20, 30, 45, 60, 90, 120),
    "location": ("Conference Room B", "Zoom", "Downtown Dental Clinic", "Cafe Luna", "Room 204"),
    "send_sms.message": ("Running 10 minutes late", "Dinner is at 7 tonight", "Can you pick up milk?",
                         "Happy birthday!", "The package arrived"),
    "set_reminder.message": ("call the plumber", "pick up groceries", "submit the expense report",
                             "water the plants", "renew my passport", "pay the electricity bill"),
    "subject": ("Meeting notes", "Invoice 4471", "Weekend plans", "Project update", "Quick question",
                "Travel itinerary"),
    "body": ("The report is attached.", "Can we move our call to Friday?", "Thanks for your help yesterday!",
             "Please review the draft by Monday.", "I will be out of office next week."),
    "search_emails.query": ("invoice", "flight confirmation", "password reset", "team offsite", "receipt"),
    "max_results": (5, 10, 20, 25, 50),
    "channel": ("#engineering", "#general", "#marketing", "#random", "#design", "#support"),
    "post_slack_message.text": ("Deploy finished successfully", "Standup moved to 10:30", "Lunch is here",
                                "Retro starts at 4pm"),
    "get_directions.origin": LANDMARKS, "get_directions.destination": LANDMARKS,
    "get_travel_time.origin": LANDMARKS, "get_travel_time.destination": LANDMARKS,
    "find_nearby_places.location": LANDMARKS + ADDRESSES[:4],
    "radius_meters": (200, 500, 800, 1000, 1500, 2000, 5000),
    "address": ADDRESSES, "delivery_address": ADDRESSES,
    "search_products.query": ("wireless headphones", "running shoes", "coffee grinder", "4K monitor", "yoga mat",
                              "mechanical keyboard", "air fryer", "backpack", "desk lamp", "water bottle"),
    "max_price": (25, 50, 80, 100, 150, 200, 300, 500),
    "search_hotels.min_rating": (3, 3.5, 4, 4.5),
    "get_product_reviews.min_rating": (3, 4, 5),
    "quantity": (1, 2, 3, 4, 5),
    "expression": ("(12 + 7) * 3", "2 ** 10", "144 / 12 + 5", "sqrt(81) + 4", "15 * 4 - 9", "(3.5 + 2.25) * 8"),
    "value": (5, 12, 100, 3.5, 42, 250, 0.75),
    "part": (15, 45, 120, 37.5, 8, 64),
    "whole": (60, 200, 480, 150, 32, 256),
    "a": (1, 2, 3, -1, 4), "b": (-7, -4, -2, 0, 3, 5, 6, 10), "c": (-12, -8, -3, 1, 2, 4, 9),
    "read_file.path": FILES, "write_file.path": FILES, "list_directory.path": DIRS,
    "content": ("Meeting moved to Thursday.", "TODO: update dependencies", "hello world", "Backup finished."),
    "archive_name": ("backup.zip", "reports_2025.zip", "logs.tar.gz", "photos.zip"),
    "podcast_name": ("The Daily", "Radiolab", "Hardcore History", "Planet Money", "99% Invisible", "Science Vs"),
    "limit": (3, 5, 10),
    "search_news.query": ("electric vehicles", "the climate summit", "interest rates", "the Mars mission",
                          "AI regulation", "the World Cup"),
    "translate_text.text": ("Where is the train station?", "Good morning, how are you?", "The meeting starts at noon.",
                            "Thank you for dinner.", "I would like a coffee, please."),
    "translate_text.source_language": ("English",),
    "translate_text.target_language": LANGUAGES[1:],
    "detect_language.text": ("Où est la gare ?", "Ich habe Hunger", "¿Dónde está el baño?", "Grazie mille",
                             "Obrigado pela ajuda", "Dziękuję bardzo"),
    "word": ("serendipity", "ephemeral", "ubiquitous", "quixotic", "petrichor", "laconic"),
    "distance_km": (3, 5, 7.5, 10, 12.5, 21.1, 42.2),
    "weight_kg": (55, 62.5, 70, 78, 85, 92.3),
    "height_cm": (158, 165, 172, 180, 188, 193),
    "room": ("living room", "bedroom", "office", "kitchen", "basement", "nursery"),
    "temperature": (18, 19.5, 20, 21, 22, 23.5, 24),
    "brightness": (10, 25, 40, 50, 60, 75),
    "max_prep_minutes": (15, 20, 30, 45, 60),
    "restaurant": ("Luigi's Trattoria", "Golden Dragon", "Taco Fiesta", "Green Bowl", "Burger Barn"),
    "year": tuple(range(1975, 2025, 3)),
    "days": (1, 2, 3, 5, 7, 10, 14),
    "passengers": (1, 2, 3, 4, 5),
    "guests": (1, 2, 3, 4, 6),
    "rooms": (1, 2, 3),
    "origin": AIRPORTS, "destination": AIRPORTS, "currency": CURRENCIES,
    "from_currency": CURRENCIES, "to_currency": CURRENCIES, "base_currency": CURRENCIES,
    "target_currency": CURRENCIES,
}
_LISTS: dict[str, tuple[Sequence[Any], int, int]] = {
    "numbers": ((4, 8, 15, 16, 23, 42, 3.5, 7, 12, 19, 27, 31, 2.5, 10), 4, 7),
    "paths": (FILES, 2, 3),
    "ingredients": (("chicken", "rice", "spinach", "chickpeas", "tomatoes", "tofu", "mushrooms", "garlic",
                     "lentils", "salmon"), 2, 3),
    "items": (("margherita pizza", "garlic bread", "caesar salad", "pad thai", "spring rolls", "chicken burrito"),
              1, 3),
}
_DATE_BASE = _dt.date(2025, 1, 1)


def _date(rng: random.Random) -> str:
    return (_DATE_BASE + _dt.timedelta(days=rng.randrange(365))).isoformat()


def _after(d: str, rng: random.Random, lo: int, hi: int) -> str:
    return (_dt.date.fromisoformat(d) + _dt.timedelta(days=rng.randint(lo, hi))).isoformat()


def _time(rng: random.Random) -> str:
    return f"{rng.randint(7, 20):02d}:{rng.choice((0, 15, 30, 45)):02d}"


_LATER = {"return_date": ("departure_date", "pickup_date"), "check_out": ("check_in",), "end_date": ("start_date",)}


def _sample(tool: CatalogTool, param: str, filled: Mapping[str, Any], rng: random.Random) -> Any:
    """A realistic value for one argument (dates ordered, unit pairs compatible, song/artist matched)."""
    schema = tool.tool.properties[param]
    name = tool.tool.name
    if param in _LATER:
        for first in _LATER[param]:
            if first in filled:
                return _after(filled[first], rng, 1, 14)
    if name == "convert_units":
        if param == "from_unit":
            return rng.choice(UNIT_PAIRS)[0]
        if param == "to_unit":
            return rng.choice([b for a, b in UNIT_PAIRS if a == filled["from_unit"]])
    if name == "play_song":
        if param == "title":
            return rng.choice(SONGS)[0]
        if param == "artist":
            return dict(SONGS)[filled["title"]]
    if name == "send_email" and param == "to":
        return f"{rng.choice(PEOPLE)}@example.com"
    if name == "delete_event":
        return "evt_" + "".join(rng.choice("0123456789abcdef") for _ in range(6))
    if name in ("add_to_cart", "get_product_reviews") and param == "product_id":
        return f"SKU-{rng.randint(10000, 99999)}"
    if name == "track_order":
        return f"ORD-{rng.randint(100000, 999999)}"
    if name == "send_sms" and param == "phone_number":
        return f"+1-{rng.randint(201, 989)}-555-{rng.randint(100, 9999):04d}"
    if param in _LISTS:
        pool, lo, hi = _LISTS[param]
        return rng.sample(list(pool), rng.randint(lo, hi))
    pool = _POOLS.get(f"{name}.{param}", _POOLS.get(param))
    if pool is not None:
        return rng.choice(list(pool))
    if "enum" in schema:
        return rng.choice(schema["enum"])
    if schema.get("pattern") == _DATE["pattern"]:
        return _date(rng)
    if schema.get("pattern") == _TIME["pattern"]:
        return _time(rng)
    raise KeyError(f"no value sampler for {name}.{param}")


def _text(value: Any) -> str:
    """How a value is written in a query: lists as comma-separated items, everything else as str()."""
    if isinstance(value, list):
        return ", ".join(str(v) for v in value)
    return str(value)


def fill(tool: CatalogTool, intent: Intent, rng: random.Random, *, tries: int = 20) -> tuple[str, Call]:
    """A query for one intent and its reference call. String values within one call are distinct."""
    for _ in range(tries):
        args: dict[str, Any] = {}
        for param in tool.tool.properties:  # declared order, so dependent values see their anchors
            if param in intent.slots:
                args[param] = _sample(tool, param, args, rng)
        strings = [v for v in args.values() if isinstance(v, str)]
        if len(set(strings)) == len(strings):
            break
    query = intent.template.format(**{k: _text(v) for k, v in args.items()})
    return query, Call(tool.tool.name, {**args, **intent.fixed})


# ---------------------------------------------------------------------------------------------
# Examples
# ---------------------------------------------------------------------------------------------

CHITCHAT = (
    ("Hi there! How are you today?", "Hello! I'm doing well, thank you. How can I help you today?"),
    ("Thanks, that's all I needed.", "You're welcome! Have a great day."),
    ("What's the capital of Australia?", "The capital of Australia is Canberra."),
    ("Can you tell me a fun fact?", "Sure! Honey never spoils: edible honey has been found in ancient Egyptian "
                                    "tombs."),
    ("How many days are there in a leap year?", "A leap year has 366 days."),
    ("Who wrote Pride and Prejudice?", "Pride and Prejudice was written by Jane Austen."),
    ("What does CPU stand for?", "CPU stands for central processing unit."),
    ("Good night!", "Good night! Sleep well."),
    ("What is the boiling point of water at sea level in Celsius?", "Water boils at 100 degrees Celsius at sea "
                                                                    "level."),
    ("Tell me a short joke.", "Why did the scarecrow win an award? Because he was outstanding in his field."),
)
_JOINERS = ("Also, ", "And ", "Then ", "After that, ", "In addition, ")


@lru_cache(maxsize=1)
def catalog() -> tuple[CatalogTool, ...]:
    """The tool catalog (56 tools over 15 domains), in a fixed order."""
    return _catalog()


def catalog_interface() -> Interface:
    """Every catalog tool as one Interface."""
    return Interface(tuple(c.tool for c in catalog()))


def _lower_first(text: str) -> str:
    return text if text.startswith(("I ", "I'")) else text[:1].lower() + text[1:]


@dataclass(frozen=True)
class SyntheticConfig:
    """Options of the generator (see `generate_synthetic`)."""

    n: int = 200
    seed: int = 0
    tools_per_example: tuple[int, int] = (2, 5)
    parallel_fraction: float = 0.25
    no_call_fraction: float = 0.15
    same_domain_distractors: float = 0.5
    tools: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        lo_hi = tuple(self.tools_per_example)
        if len(lo_hi) != 2 or not 1 <= lo_hi[0] <= lo_hi[1]:
            raise ValueError(f"tools_per_example must be [lo, hi] with 1 <= lo <= hi, got {list(lo_hi)}")
        fractions = (self.parallel_fraction, self.no_call_fraction, self.same_domain_distractors)
        if min(fractions) < 0 or self.parallel_fraction + self.no_call_fraction > 1 or self.same_domain_distractors > 1:
            raise ValueError(f"parallel_fraction={self.parallel_fraction}, no_call_fraction={self.no_call_fraction} "
                             f"and same_domain_distractors={self.same_domain_distractors} must lie in [0, 1], "
                             f"with parallel_fraction + no_call_fraction <= 1")
        restricted_catalog(self.tools, lo_hi[1])

    def generate(self, split: str = "train") -> list[Example]:
        return generate_synthetic(self.n, self.seed, tools_per_example=self.tools_per_example,
                                  parallel_fraction=self.parallel_fraction, no_call_fraction=self.no_call_fraction,
                                  same_domain_distractors=self.same_domain_distractors, tools=self.tools, split=split)


def restricted_catalog(tools: Sequence[str], size: int = 1) -> tuple[CatalogTool, ...]:
    """The catalog's tools named in `tools`, in catalog order (empty `tools`: the whole catalog).

    A narrower task family: every example calls and lists only these tools. ValueError for an unknown
    name or fewer tools than an interface's `size`.
    """
    cat = catalog()
    if not tools:
        return cat
    known = {c.tool.name for c in cat}
    unknown = sorted(set(tools) - known)
    if unknown:
        raise ValueError(f"tools: {', '.join(unknown)} not in the synthetic catalog; valid names: "
                         f"{', '.join(sorted(known))}")
    chosen = tuple(c for c in cat if c.tool.name in set(tools))
    if len(chosen) < size:
        raise ValueError(f"tools: {len(chosen)} tools cannot fill interfaces of up to {size} tools")
    return chosen


def _interface(rng: random.Random, needed: Sequence[CatalogTool], size: int, excluded_domains: set[str],
               same_domain: float, cat: Sequence[CatalogTool]) -> Interface:
    chosen = list(needed)
    names = {c.tool.name for c in chosen}
    pool = [c for c in cat if c.tool.name not in names and c.domain not in excluded_domains]
    domains = {c.domain for c in needed}
    while len(chosen) < size and pool:
        near = [c for c in pool if c.domain in domains]
        pick = rng.choice(near if near and rng.random() < same_domain else pool)
        chosen.append(pick)
        pool.remove(pick)
    rng.shuffle(chosen)
    return Interface(tuple(c.tool for c in chosen))


def _one(i: int, seed: int, lo: int, hi: int, parallel_fraction: float, no_call_fraction: float,
         same_domain: float, only: tuple[str, ...] = (), split: str = "train") -> Example:
    stream = "cipr-synthetic" if split == "train" else f"cipr-synthetic-{split}"
    rng = random.Random(f"{stream}:{seed}:{i}")
    cat = restricted_catalog(only)
    r = rng.random()
    kind = "no_call" if r < no_call_fraction else "parallel" if r < no_call_fraction + parallel_fraction else "single"
    size = rng.randint(lo, hi)
    meta: dict[str, Any] = {"kind": kind}
    response = None
    calls: list[Call] = []
    if kind == "no_call":
        if rng.random() < 0.5:
            query, response = rng.choice(CHITCHAT)
            interface = _interface(rng, [], size, set(), same_domain, cat)
            meta["reason"] = "no_tool_needed"
        else:
            asked = rng.choice(cat)
            query, _ = fill(asked, rng.choice(asked.intents), rng)
            response = f"Sorry, I can't {asked.capability} with the tools available to me."
            interface = _interface(rng, [], size, {asked.domain}, same_domain, cat)
            meta.update(reason="tool_unavailable", unavailable_tool=asked.tool.name, domain=asked.domain)
    else:
        count = 1 if kind == "single" else rng.choice((2, 2, 2, 3))
        if kind == "parallel" and rng.random() < 0.5:
            tools = [rng.choice(cat)] * count
        else:
            tools = rng.sample(list(cat), count)
        queries: list[str] = []
        for tool in tools:
            for _ in range(20):  # repeated calls of one tool ask for different things
                query, call = fill(tool, rng.choice(tool.intents), rng)
                if call not in calls:
                    break
            queries.append(query if not queries else rng.choice(_JOINERS) + _lower_first(query))
            calls.append(call)
        query = " ".join(queries)
        needed = list({t.tool.name: t for t in tools}.values())
        interface = _interface(rng, needed, max(size, len(needed)), set(), same_domain, cat)
        meta["domains"] = sorted({t.domain for t in needed})
    prefix = "synthetic" if split == "train" else f"synthetic-{split}"
    return Example(id=f"{prefix}-{seed}-{i:05d}", messages=(Message("user", query),), interface=interface,
                   reference=tuple(calls), response=response, source="synthetic", partition=kind, meta=meta)


def generate_synthetic(n: int, seed: int = 0, *, tools_per_example: tuple[int, int] = (2, 5),
                       parallel_fraction: float = 0.25, no_call_fraction: float = 0.15,
                       same_domain_distractors: float = 0.5, tools: Sequence[str] = (),
                       split: str = "train") -> list[Example]:
    """`n` synthetic Examples, deterministic in (n, seed, options, split).

    - `split`: "train" (training data, `cipr-train data=synthetic`) or "test" (the evaluation's
      `benchmark=synthetic`). The test split draws from its own random stream and drops every item whose
      query and reference calls equal one of the first `TRAIN_GUARD` training items of the same seed
      (the template space is small: about a quarter of a separate stream's items repeat a training
      item, the fixed chit-chat no-call items among them), so no test item was trained on under any
      `data.n` up to that bound. Test ids are `synthetic-test-<seed>-<stream index>`.
    - `tools_per_example`: inclusive range of the interface size (raised to the number of tools a
      parallel example needs).
    - `parallel_fraction`, `no_call_fraction`: probabilities of the parallel and no-call kinds; the
      rest are single calls.
    - `same_domain_distractors`: probability that each distractor is drawn from the needed tools'
      domains (harder negatives) rather than from the whole catalog.
    - `tools`: catalog tool names the examples are restricted to (empty: the whole catalog), a narrower
      task family (`restricted_catalog`).
    """
    lo, hi = tools_per_example
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    if not 1 <= lo <= hi <= len(catalog()):
        raise ValueError(f"tools_per_example must satisfy 1 <= lo <= hi <= {len(catalog())}, got {tools_per_example}")
    restricted_catalog(tools, hi)
    fractions = (parallel_fraction, no_call_fraction, same_domain_distractors)
    if min(fractions) < 0 or parallel_fraction + no_call_fraction > 1 or same_domain_distractors > 1:
        raise ValueError("fractions must be in [0, 1] and parallel_fraction + no_call_fraction <= 1")
    if split not in ("train", "test"):
        raise ValueError(f"split must be 'train' or 'test', got {split!r}")
    options = (lo, hi, parallel_fraction, no_call_fraction, same_domain_distractors, tuple(tools))
    if split == "train":
        return [_one(i, seed, *options) for i in range(n)]
    trained = {_item_key(_one(i, seed, *options)) for i in range(TRAIN_GUARD)}
    out: list[Example] = []
    i = 0
    while len(out) < n:
        example = _one(i, seed, *options, split)
        if _item_key(example) not in trained:
            out.append(example)
        i += 1
    return out


TRAIN_GUARD = 5000


def _item_key(example: Example) -> tuple[str, str]:
    """What makes two synthetic items the same task: the query and the reference calls."""
    calls = json.dumps([c.to_dict() for c in example.reference], sort_keys=True)
    return str(example.messages[0].content), calls


def synthetic_stats(n: int = 200, seed: int = 0, **options: Any) -> dict[str, Any]:
    """Catalog size per domain and, for `generate_synthetic(n, seed, **options)`, counts per kind."""
    exs = generate_synthetic(n, seed, **options)
    sizes = [len(e.interface) for e in exs]
    return {
        "catalog_tools": len(catalog()),
        "catalog_domains": dict(sorted(Counter(c.domain for c in catalog()).items())),
        "templates": sum(len(c.intents) for c in catalog()),
        "examples": len(exs),
        "kinds": dict(sorted(Counter(e.partition for e in exs).items())),
        "calls": sum(len(e.reference) for e in exs),
        "tools_per_example": {"min": min(sizes, default=0), "max": max(sizes, default=0),
                              "mean": round(sum(sizes) / len(sizes), 3) if sizes else 0.0},
        "seed": seed,
    }

