"""A stack kept up between pytest runs (`haico stack`): its supervisor, and up, status and
down."""
