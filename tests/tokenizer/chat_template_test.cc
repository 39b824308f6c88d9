#include "model/chat_template.h"

#include <gtest/gtest.h>

#include <vector>

namespace polychip::model {
namespace {

const std::vector<ChatMessage> kChat = {
    {"system", "You are terse."},
    {"user", "Hi"},
    {"assistant", "Hello."},
    {"user", " Bye "},
};

TEST(ChatTemplate, ChatMl) {
  EXPECT_EQ(ApplyChatTemplate(ChatFormat::kChatMl, kChat, true),
            "<|im_start|>system\nYou are terse.<|im_end|>\n"
            "<|im_start|>user\nHi<|im_end|>\n"
            "<|im_start|>assistant\nHello.<|im_end|>\n"
            "<|im_start|>user\n Bye <|im_end|>\n"
            "<|im_start|>assistant\n");
  EXPECT_EQ(ApplyChatTemplate(ChatFormat::kChatMl, std::span(kChat).subspan(1, 1), false),
            "<|im_start|>user\nHi<|im_end|>\n");
}

TEST(ChatTemplate, Qwen3KeepsTheReasoningOnlyAfterTheLastQuestion) {
  const std::vector<ChatMessage> chat = {
      {"system", "Be brief."},
      {"user", "2+2?"},
      {"assistant", "<think>\nadd them\n</think>\n\n4"},
      {"user", "3+3?"},
  };
  // An answered turn keeps its answer only; the generation prompt opens the assistant's turn
  // and leaves the <think> block to the model (whose output passes it through).
  EXPECT_EQ(ApplyChatTemplate(ChatFormat::kQwen3, chat, true),
            "<|im_start|>system\nBe brief.<|im_end|>\n"
            "<|im_start|>user\n2+2?<|im_end|>\n"
            "<|im_start|>assistant\n4<|im_end|>\n"
            "<|im_start|>user\n3+3?<|im_end|>\n"
            "<|im_start|>assistant\n");
  // After the last question (a turn being continued) the reasoning stays, re-wrapped.
  const std::vector<ChatMessage> open = {{"user", "3+3?"}, {"assistant", "<think>sum</think>6"}};
  EXPECT_EQ(ApplyChatTemplate(ChatFormat::kQwen3, open, false),
            "<|im_start|>user\n3+3?<|im_end|>\n"
            "<|im_start|>assistant\n<think>\nsum\n</think>\n\n6<|im_end|>\n");
  // Without a question, or without think tags, it is plain ChatML.
  EXPECT_EQ(ApplyChatTemplate(ChatFormat::kQwen3, kChat, true),
            ApplyChatTemplate(ChatFormat::kChatMl, kChat, true));
  EXPECT_EQ(DetectChatFormat("{{'<|im_start|>' + message.role}}{% if '</think>' in content %}"
                             "{{ '<think>\\n' }}"),
            ChatFormat::kQwen3);
  EXPECT_EQ(*ChatFormatFromName("qwen3"), ChatFormat::kQwen3);
}

TEST(ChatTemplate, Llama2) {
  EXPECT_EQ(ApplyChatTemplate(ChatFormat::kLlama2Sys, kChat, true),
            "[INST] <<SYS>>\nYou are terse.\n<</SYS>>\n\nHi [/INST]Hello.</s>[INST]  Bye  [/INST]");
  EXPECT_EQ(ApplyChatTemplate(ChatFormat::kLlama2SysBos, kChat, true),
            "[INST] <<SYS>>\nYou are terse.\n<</SYS>>\n\nHi [/INST]Hello.</s><s>[INST]  Bye  [/INST]");
  EXPECT_EQ(ApplyChatTemplate(ChatFormat::kLlama2SysStrip, kChat, true),
            "[INST] <<SYS>>\nYou are terse.\n<</SYS>>\n\nHi [/INST]Hello.</s>[INST] Bye [/INST]");
  EXPECT_EQ(ApplyChatTemplate(ChatFormat::kLlama2, kChat, true),
            "[INST] You are terse.\nHi [/INST]Hello.</s>[INST]  Bye  [/INST]");
}

TEST(ChatTemplate, Llama3) {
  EXPECT_EQ(ApplyChatTemplate(ChatFormat::kLlama3, kChat, true),
            "<|start_header_id|>system<|end_header_id|>\n\nYou are terse.<|eot_id|>"
            "<|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>"
            "<|start_header_id|>assistant<|end_header_id|>\n\nHello.<|eot_id|>"
            "<|start_header_id|>user<|end_header_id|>\n\nBye<|eot_id|>"
            "<|start_header_id|>assistant<|end_header_id|>\n\n");
}

TEST(ChatTemplate, Phi3AndGemma) {
  EXPECT_EQ(ApplyChatTemplate(ChatFormat::kPhi3, std::span(kChat).subspan(1, 1), true),
            "<|user|>\nHi<|end|>\n<|assistant|>\n");
  EXPECT_EQ(ApplyChatTemplate(ChatFormat::kGemma, kChat, true),
            "<start_of_turn>user\nYou are terse.\n\nHi<end_of_turn>\n"
            "<start_of_turn>model\nHello.<end_of_turn>\n"
            "<start_of_turn>user\nBye<end_of_turn>\n<start_of_turn>model\n");
}

TEST(ChatTemplate, DetectsFamilyFromJinjaMarkers) {
  EXPECT_EQ(DetectChatFormat("{% for message in messages %}{{'<|im_start|>' + message['role']"),
            ChatFormat::kChatMl);
  EXPECT_EQ(DetectChatFormat("{{ bos_token }}{{ '<|start_header_id|>' + message['role'] + "
                             "'<|end_header_id|>\n\n' }}"),
            ChatFormat::kLlama3);
  EXPECT_EQ(DetectChatFormat("{% if messages[0]['role'] == 'system' %}<<SYS>>\n{{ '[INST] ' + "
                             "content.strip() + ' [/INST]' }}"),
            ChatFormat::kLlama2SysStrip);
  EXPECT_EQ(DetectChatFormat("{{ '[INST] ' + message['content'] + ' [/INST]' }}"),
            ChatFormat::kLlama2);
  EXPECT_EQ(DetectChatFormat("{{'<|user|>' + '\n' + message['content'] + '<|end|>' + '\n' + "
                             "'<|assistant|>' + '\n'}}"),
            ChatFormat::kPhi3);
  EXPECT_EQ(DetectChatFormat("{{ '<start_of_turn>' + role + '\n' }}"), ChatFormat::kGemma);
  // Gemma 3's template (google/gemma-3-*-it): the system text folded into the first user turn.
  EXPECT_EQ(DetectChatFormat("{{ bos_token }}{%- if messages[0]['role'] == 'system' -%}{%- set "
                             "first_user_prefix = messages[0]['content'] + '\n\n' -%}{%- endif "
                             "-%}{{ '<start_of_turn>' + role + '\n' + (first_user_prefix if "
                             "loop.first else \"\") }}{{ '<end_of_turn>\n' }}"),
            ChatFormat::kGemma);
  EXPECT_EQ(DetectChatFormat(""), ChatFormat::kChatMl);  // the default
}

TEST(ChatTemplate, OverrideByName) {
  auto f = SelectChatFormat("llama3", "<|im_start|>");
  ASSERT_TRUE(f.ok());
  EXPECT_EQ(*f, ChatFormat::kLlama3);
  EXPECT_EQ(*SelectChatFormat("", "<|im_start|>"), ChatFormat::kChatMl);
  auto bad = SelectChatFormat("vicuna-ish", "");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("chatml"), std::string::npos);
  for (ChatFormat format : {ChatFormat::kChatMl, ChatFormat::kLlama2SysBos, ChatFormat::kGemma}) {
    EXPECT_EQ(*ChatFormatFromName(ChatFormatName(format)), format);
  }
}

}  // namespace
}  // namespace polychip::model
