"""A program that gives up on a streamed answer, as a client with a timeout does.

The plain ``openai`` client from the environment streams a long answer, reads its
first chunk, and closes the stream; then it asks a short question and prints one JSON
line: the abandoned call's id and the short answer's id.
"""

import json

from openai import OpenAI

client = OpenAI()
stream = client.chat.completions.create(
    model="gpt-4o",
    messages=[{"role": "user", "content": "Write a very long story about a lighthouse keeper."}],
    max_tokens=2000,
    stream=True,
    extra_body={"ignore_eos": True},
)
first = next(iter(stream))
stream.close()  # the client goes away mid-stream

short = client.chat.completions.create(
    model="gpt-4o", messages=[{"role": "user", "content": "Say hi."}], max_tokens=4, temperature=0
)
print(json.dumps({"abandoned_id": first.id, "short_id": short.id}))
