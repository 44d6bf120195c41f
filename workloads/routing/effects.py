"""Declared effects of the BFCL API methods: which calls may be speculated.

Declared from reading the source of every public method of the eight multi-turn classes,
never inferred at run time: a fill may only run a call declared read-only, and a call
declared mutating bumps its class's version (C1's freshness guard). A method that is not
declared counts as mutating. ``tests/test_bfcl.py`` checks that every method is declared
exactly once and that no ground-truth call declared read-only changes its instance's state.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Any


def _methods(names: str) -> frozenset[str]:
    return frozenset(names.split())


READ_ONLY: Mapping[str, frozenset[str]] = MappingProxyType(
    {
        "GorillaFileSystem": _methods("pwd ls cat find wc sort grep du tail diff"),
        "MathAPI": _methods(
            "logarithm mean standard_deviation si_unit_conversion imperial_si_conversion add "
            "subtract multiply divide power square_root absolute_value round_number "
            "percentage min_value max_value sum_values"
        ),
        "MessageAPI": _methods(
            "list_users get_user_id message_get_login_status view_messages_sent "
            "search_messages get_message_stats"
        ),
        "TwitterAPI": _methods(
            "posting_get_login_status list_all_following get_tweet get_user_tweets "
            "search_tweets get_tweet_comments get_user_stats"
        ),
        "TicketAPI": _methods("get_ticket ticket_get_login_status get_user_tickets"),
        "TradingBot": _methods(
            "get_current_time get_symbol_by_name get_stock_info get_order_details "
            "get_account_info trading_get_login_status get_watchlist get_order_history "
            "get_transaction_history get_available_stocks filter_stocks_by_price "
            "notify_price_change"
        ),
        # NOTE: get_flight_cost rewrites the private ``_flight_cost_lookup``, a scratch cache
        # that book_flight refills itself before reading it: no later result depends on it.
        "TravelAPI": _methods(
            "travel_get_login_status get_budget_fiscal_year get_flight_cost "
            "get_credit_card_balance retrieve_invoice get_booking_history list_all_airports "
            "compute_exchange_rate verify_traveler_information get_nearest_airport_by_city "
            "contact_customer_support get_all_credit_cards"
        ),
        "VehicleControlAPI": _methods(
            "get_outside_temperature_from_weather_com displayCarStatus display_log "
            "estimate_drive_feasibility_by_mileage liter_to_gallon gallon_to_liter "
            "estimate_distance get_zipcode_based_on_city check_tire_pressure "
            "find_nearest_tire_shop"
        ),
    }
)

MUTATING: Mapping[str, frozenset[str]] = MappingProxyType(
    {
        # NOTE: cd moves the current directory, which every later relative call reads;
        # echo only mutates when it writes a file (see declared_read_only).
        "GorillaFileSystem": _methods("cd mkdir touch echo mv rm rmdir cp"),
        "MathAPI": _methods(""),
        "MessageAPI": _methods("message_login send_message delete_message add_contact"),
        "TwitterAPI": _methods(
            "authenticate_twitter post_tweet retweet comment mention follow_user unfollow_user"
        ),
        "TicketAPI": _methods(
            "create_ticket close_ticket resolve_ticket edit_ticket ticket_login logout"
        ),
        "TradingBot": _methods(
            "cancel_order place_order withdraw_funds trading_login trading_logout "
            "fund_account remove_stock_from_watchlist add_to_watchlist"
        ),
        "TravelAPI": _methods(
            "authenticate_travel register_credit_card book_flight cancel_booking "
            "set_budget_limit purchase_insurance"
        ),
        # NOTE: the two sensor reads draw from the instance's seeded RNG: a speculative call
        # would change what the canonical call then reads, so they count as mutating.
        "VehicleControlAPI": _methods(
            "startEngine fillFuelTank lockDoors adjustClimateControl setHeadlights "
            "activateParkingBrake pressBrakePedal releaseBrakePedal setCruiseControl "
            "set_navigation get_outside_temperature_from_google get_current_speed"
        ),
    }
)


def declared_read_only(cls: str, method: str, arguments: Mapping[str, Any]) -> bool:
    """The declared effect of ``cls.method(**arguments)``; undeclared methods mutate.

    ``GorillaFileSystem.echo`` is the one method whose effect depends on its arguments: it
    prints when no ``file_name`` is given and writes the file otherwise.
    """
    if (cls, method) == ("GorillaFileSystem", "echo"):
        return arguments.get("file_name") is None
    return method in READ_ONLY.get(cls, ())
