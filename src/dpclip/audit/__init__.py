"""The one-run privacy audit (Steinke, Nasr and Jagielski 2023): canaries inserted into the
members, their scores after training, and the lower bound on epsilon those scores certify.
"""
