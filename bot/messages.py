"""What kbbot says in its own words, in the user's language."""

from __future__ import annotations

MESSAGES: dict[str, dict[str, str]] = {
    "not_found": {
        "en": "I could not find this in the knowledge base, so I cannot answer it reliably. "
              "Please rephrase the question with the product model or fault code, or contact the service team.",
        "zh": "知识库中没有找到与这个问题相关的内容，因此无法给出可靠的回答。"
              "请补充产品型号或故障代码后重新提问，或联系售后服务团队。",
    },
    "off_topic": {
        "en": "That is outside what I can help with. I answer questions from the company knowledge base about: {subjects}.",
        "zh": "这个问题超出了我的服务范围。我只根据公司知识库回答以下方面的问题：{subjects}。",
    },
    "clarify": {
        "en": "The answer depends on the model. Which one do you mean: {candidates}?",
        "zh": "答案因型号而异。请问您指的是哪个型号：{candidates}？",
    },
    "cached_label": {
        "en": "✅ Previously approved answer (a reviewer confirmed it; ask again starting with !fresh for a new one):",
        "zh": "✅ 这是经审核确认过的回答（如需重新生成，请在问题前加 !fresh）：",
    },
    "cached_label_by": {
        "en": "✅ Previously approved answer (approved by {who} on {date}; ask again starting with !fresh "
              "for a new one):",
        "zh": "✅ 这是经审核确认过的回答（由 {who} 于 {date} 确认；如需重新生成，请在问题前加 !fresh）：",
    },
    "stale_notice": {
        "en": "⚠️ Note: a source cited here changed while this answer was written; check the current document.",
        "zh": "⚠️ 注意：本回答引用的资料在生成过程中已更新，请以最新文档为准。",
    },
    "empty_question": {
        "en": "Please type a question, for example: “How often should the bearings be greased?”",
        "zh": "请输入一个问题，例如：“电机过热怎么办？”",
    },
    "too_long": {
        "en": "That message is too long ({length} characters; the limit is {limit}). Please ask a shorter question.",
        "zh": "消息太长（{length} 个字符，上限为 {limit}）。请缩短问题后再问。",
    },
    "rate_limited_user": {
        "en": "You are asking faster than I can answer ({limit} questions per {window}). "
              "Please wait {seconds} s and ask again.",
        "zh": "提问过于频繁（每{window_zh}最多 {limit} 个问题）。请等待 {seconds} 秒后再问。",
    },
    "rate_limited_channel": {
        "en": "This conversation is asking faster than I can answer ({limit} questions per {window}). "
              "Please wait {seconds} s and ask again.",
        "zh": "此会话提问过于频繁（每{window_zh}最多 {limit} 个问题）。请等待 {seconds} 秒后再问。",
    },
    "busy": {
        "en": "I am answering many questions right now. Please ask again in a moment.",
        "zh": "当前提问较多，请稍后再问。",
    },
    "model_unavailable": {
        "en": "The language model is not answering right now ({reason}). Please try again in a minute.",
        "zh": "语言模型暂时无法响应（{reason}）。请稍后再试。",
    },
    "model_empty": {
        "en": "The language model returned an empty answer. Please try again.",
        "zh": "语言模型返回了空回答，请重试。",
    },
    "store_unavailable": {
        "en": "The knowledge base cannot be reached right now ({reason}). Please try again shortly.",
        "zh": "暂时无法访问知识库（{reason}）。请稍后再试。",
    },
    "state_unavailable": {
        "en": "kbbot cannot reach its conversation store right now ({reason}). Please try again shortly.",
        "zh": "暂时无法访问会话存储（{reason}）。请稍后再试。",
    },
    "internal": {
        "en": "Something went wrong while answering (reference {turn_id}). Please try again.",
        "zh": "回答时出现错误（编号 {turn_id}）。请重试。",
    },
    "timeout": {
        "en": "Answering took too long (over {seconds:.0f} s) and was stopped. Please try again.",
        "zh": "回答超时（超过 {seconds:.0f} 秒）已停止，请重试。",
    },
}


def say(key: str, language: str, **values: object) -> str:
    table = MESSAGES[key]
    return table.get(language, table["en"]).format(**values)
